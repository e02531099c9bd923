# shellcheck shell=bash
# Summary: Container settings read by _container.sh (sourced). The environment always wins over these defaults.
#
# Every value below is ${VAR:-default}: `DOCKER_IMAGE=my/image:tag ./run_local.sh tiny` needs no edit here.
# Site values and credentials go to configs/container_settings.local.sh (gitignored, optional). It is read
# first; write its lines in the same ${VAR:-value} form so the environment still wins, e.g.
#   DOCKER_USERNAME=${DOCKER_USERNAME:-me}
#   DOCKER_TOKEN=${DOCKER_TOKEN:-dckr_pat_...}
#   DATASET_DIR=${DATASET_DIR:-/shared/datasets}

_container_settings_local=${BASH_SOURCE[0]%/*}/container_settings.local.sh
# shellcheck source=/dev/null
if [[ -f $_container_settings_local ]]; then source "$_container_settings_local"; fi
unset _container_settings_local

# Registry put in front of DOCKER_IMAGE when the image names none (ghcr.io/x/y, localhost/x, host:5000/x name one).
DOCKER_REGISTRY=${DOCKER_REGISTRY:-docker.io}
# Training image, or the path of a local image tarball (*.tar), loaded with `<runtime> load` before the run.
# A tag can be moved by whoever controls the registry; pin by digest (name@sha256:<digest>, as `<runtime> image
# inspect --format '{{.RepoDigests}}' <image>` shows it) so that every node, every time, runs the same image.
DOCKER_IMAGE=${DOCKER_IMAGE:-rocm/jax-training:maxtext-v26.2}
# Where the MaxText checkout lives inside the image; crosses into the container as MAXTEXT_REPO_DIR.
MAXTEXT_REPO_DIR=${MAXTEXT_REPO_DIR:-/workspace/maxtext}
# Host dataset directory, mounted read-only at /datasets when it exists.
DATASET_DIR=${DATASET_DIR:-/mnt/datasets}
# Open-files limit inside the container (soft = hard). auto: 1048576, or this host's hard limit when that is
# lower (an engine cannot raise it; see container_nofile in utils/lib/container_runtime.sh).
CONTAINER_NOFILE=${CONTAINER_NOFILE:-auto}
# CAP_SYS_PTRACE for py-spy in the container: auto (while the hang watchdog or Ray is on, for their stack
# dumps), 1 (always) or 0 (never: hangs are still caught, without stacks).
CONTAINER_PTRACE=${CONTAINER_PTRACE:-auto}
# Extra words for `<runtime> run`, split on whitespace (e.g. "--runtime runc" or "--security-opt seccomp=unconfined").
CONTAINER_RUN_EXTRA_ARGS=${CONTAINER_RUN_EXTRA_ARGS:-}
# Registry credentials, used only when an anonymous pull fails. Keep them in the .local file, never in git.
DOCKER_USERNAME=${DOCKER_USERNAME:-}
DOCKER_TOKEN=${DOCKER_TOKEN:-}
