#!/usr/bin/env bash
# Usage: utils/build_image.sh [--save FILE] [--engine podman|docker] [--name REPO] [--rebuild] [--tag-only]
# Summary: Build the CPU training image from requirements.lock, with no registry; cached by the lock's hash
#
# The image: Debian bookworm (minbase, from Debian's own archive), the libraries MaxText's imports need,
# iproute2, procps and Debian's prometheus (for RAY=1 inside the container); this machine's Python >= 3.12
# copied in at the path it has here (so its shared library is found without a rebuild); a venv at /opt/venv
# with exactly the pins of requirements.lock. The repo itself is not in the image: _container.sh mounts it.
# Image settings, so that no CONTAINER_RUN_EXTRA_ARGS are needed to run it:
#   ENV PATH=/opt/venv/bin:...   the venv's python3 is the one training runs with (TRAIN_PYTHON default)
#   ENV VENV_DIR=/opt/venv       the launcher's tools look for their venv there, not in the mounted repo
#   LABEL maxtext-launcher.*     lock hash, Python version, venv, builder commit (read by `jobkit image-info`)
#
# The tag is <REPO>:<key>, where key is the first 12 hex digits of a hash of requirements.lock, the Python
# version, the base package list and this recipe's version; <REPO>:latest points at the newest build. When
# the tagged image exists, nothing is built (a second call takes seconds). The last line on stdout is the
# image reference, so `DOCKER_IMAGE=$(utils/build_image.sh)` works; progress goes to stderr.
#
#   --save FILE     also write the image as a tarball that `podman load` / `docker load` read, and so
#                   DOCKER_IMAGE=FILE. An existing FILE is never overwritten: when it already holds this
#                   image's tag it is kept as it is; otherwise the build stops with an error.
#   --engine E      podman (default when it answers) or docker
#   --name REPO     image repository (default localhost/maxtext-cpu)
#   --rebuild       build even when the tagged image exists (replaces that tag, nothing else)
#   --tag-only      print the image reference this checkout would build, and exit (builds nothing; so
#                   not with --rebuild or --save)
#
#   PYTHON=<path>   interpreter to copy in (default: what utils/setup_env.sh --python picks)
#   DEBIAN_MIRROR   Debian archive for debootstrap (default http://deb.debian.org/debian)
#   IMAGE_CACHE_DIR where the base root filesystem is kept between builds (default <repo>/.cache/image)
#
# Needs root (debootstrap and chroot) and installs podman, runc and debootstrap with apt-get when missing.
# First build on a 2-core machine: about 4 minutes (debootstrap ~40 s, venv ~1 min, import ~1 min).
# A GPU image is built at a site from utils/Containerfile.gpu instead (a vendor's JAX base image).
set -euo pipefail
[[ -n ${_DEBUG:-} ]] && set -x

_PROG=build_image.sh
_UTILS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_REPO_DIR=$(cd "$_UTILS_DIR/.." && pwd)
# shellcheck source=utils/lib/apt_install.sh
source "$_UTILS_DIR/lib/apt_install.sh"

# Bump when the recipe below changes in a way that changes the image: every cached image is then rebuilt.
# 2: the venv's modules compiled to bytecode at install (see setup_env.sh's _compile_bytecode for why).
_RECIPE=2
_SUITE=bookworm
_VENV=/opt/venv
# Shared libraries MaxText's imports load (minbase lacks libssl3), the tools the training tier calls
# (ip for the cluster address, ps), Prometheus for RAY=1, and CA certificates for the venv install.
_BASE_PACKAGES=(libssl3 libsqlite3-0 libffi8 libbz2-1.0 liblzma5 zlib1g libgomp1 libstdc++6 procps iproute2
  ca-certificates prometheus)
_LABEL=maxtext-launcher

_die() { echo "$_PROG: $1" >&2; exit "${2:-1}"; }
_say() { echo "[build_image] $*" >&2; }
_usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

_WORK=""
_cleanup() {
  # Only the directories this run made; the cached base and anything the user made stay.
  if [[ -n $_WORK && -d $_WORK ]]; then rm -rf --one-file-system "$_WORK"; fi
}
trap _cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- inputs -------------------------------------------------------------------------------------------

_find_engine() {
  local want=$1 e
  if [[ -n $want ]]; then
    command -v "$want" >/dev/null 2>&1 || return 1
    echo "$want"; return 0
  fi
  for e in podman docker; do
    if command -v "$e" >/dev/null 2>&1 && timeout -k 2 20 "$e" info >/dev/null 2>&1; then echo "$e"; return 0; fi
  done
  return 1
}

# The interpreter's installation prefix, from its real path (<prefix>/bin/pythonX.Y).
_python_prefix() {
  local real
  real=$(readlink -f "$(command -v "$1")") || return 1
  dirname "$(dirname "$real")"
}

_base_key() { printf '%s\n' "$_RECIPE" "$_SUITE" "${_BASE_PACKAGES[@]}" | sha256sum | cut -c1-12; }

_image_key() {
  local python=$1
  { sha256sum <"$_REPO_DIR/requirements.lock"; "$python" -V 2>&1; _base_key; } | sha256sum | cut -c1-12
}

_image_exists() { "$1" image inspect "$2" >/dev/null 2>&1; }

# --- building -----------------------------------------------------------------------------------------

# Runs a command chrooted into ROOT, with its own /proc and mount namespace: every mount it makes goes
# away with it, so an interrupted build leaves nothing mounted.
_in_root() {
  local root=$1; shift
  unshare --mount --pid --fork --mount-proc="$root/proc" chroot "$root" "$@"
}

# The base root filesystem, kept under the cache dir: debootstrap is the slow, network-bound part, and
# it changes only with the package list. Built beside its final name and renamed, so a half-made one is
# never taken for a finished one.
_ensure_base() {
  local cache=$1 key base tmp mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
  key=$(_base_key)
  base=$cache/base-$key
  if [[ -f $base/.complete ]]; then echo "$base"; return 0; fi
  tmp=$base.tmp.$$
  _WORK=$tmp
  _say "debootstrap $_SUITE (minbase) from $mirror into $tmp"
  debootstrap --variant=minbase "$_SUITE" "$tmp" "$mirror" >&2 ||
    _die "debootstrap failed (see above); check that $mirror is reachable, or set DEBIAN_MIRROR"
  cp /etc/resolv.conf "$tmp/etc/resolv.conf"
  _say "installing ${_BASE_PACKAGES[*]} in the base"
  _in_root "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120 install -y \
    --no-install-recommends "${_BASE_PACKAGES[@]}" >&2 ||
    _die "apt-get in the image root failed (see above); rerun, or set DEBIAN_MIRROR to a reachable mirror"
  _in_root "$tmp" apt-get clean >&2
  rm -rf "$tmp/var/lib/apt/lists/"* "$tmp/etc/resolv.conf"
  touch "$tmp/.complete"
  mv "$tmp" "$base"
  _WORK=""
  echo "$base"
}

# Installs the lock into ROOT's venv: with uv when this checkout has one (parallel downloads, and the host's
# uv cache, mounted in, saves downloading what setup_env.sh already fetched), else with the venv's pip.
_install_venv() {
  local root=$1 uv="" cache=${UV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/uv}
  cp "$_REPO_DIR/requirements.lock" "$root/tmp/requirements.lock"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # This host's CA bundle, for the install only: a site that reaches PyPI through a TLS proxy has its CA
  # there, not in the image's ca-certificates. It is not left in the image.
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/tmp/host-ca.crt"
  if [[ -x $_REPO_DIR/.cache/uv/bin/uv ]]; then uv=$_REPO_DIR/.cache/uv/bin/uv; fi
  if [[ -z $uv ]] && command -v uv >/dev/null 2>&1; then uv=$(command -v uv); fi
  if [[ -n $uv ]]; then
    cp "$uv" "$root/tmp/uv"
    mkdir -p "$root/tmp/uv-cache"
    local bind=""
    if [[ -d $cache ]]; then bind=$cache; fi
    _say "installing $(grep -c '==' "$_REPO_DIR/requirements.lock") pinned packages into $_VENV with uv${bind:+ (host cache $bind)}"
    # The bind mount lives in _in_root's private mount namespace, so it cannot outlive the install.
    unshare --mount --pid --fork --mount-proc="$root/proc" bash -c '
      root=$1 bind=$2 venv=$3
      if [[ -n $bind ]]; then mount --bind "$bind" "$root/tmp/uv-cache"; fi
      exec chroot "$root" env UV_CACHE_DIR=/tmp/uv-cache UV_LINK_MODE=copy SSL_CERT_FILE=/tmp/host-ca.crt \
        /tmp/uv pip install --quiet --compile-bytecode \
        --python "$venv/bin/python" --no-deps -r /tmp/requirements.lock' _ "$root" "$bind" "$_VENV" >&2 ||
      _die "installing requirements.lock into the image failed (see above); check network access to PyPI and rerun"
  else
    _say "installing $(grep -c '==' "$_REPO_DIR/requirements.lock") pinned packages into $_VENV with pip (~2 min)"
    _in_root "$root" env PIP_CERT=/tmp/host-ca.crt "$_VENV/bin/python" -m pip install --quiet --compile --disable-pip-version-check --no-input \
      --no-cache-dir --no-deps -r /tmp/requirements.lock >&2 ||
      _die "installing requirements.lock into the image failed (see above); check network access to PyPI and rerun"
  fi
  rm -rf "$root/tmp/"* "$root/etc/resolv.conf" "$root/root/.cache"
}

_build() {
  local engine=$1 python=$2 image=$3 latest=$4 cache=$5 base prefix version revision
  base=$(_ensure_base "$cache")
  prefix=$(_python_prefix "$python") || _die "cannot resolve the real path of $python; set PYTHON to an interpreter path"
  [[ -d $prefix/lib ]] || _die "$python does not live in a <prefix>/bin layout ($prefix); set PYTHON to another interpreter"
  version=$("$python" -V 2>&1)
  _WORK=$cache/build.$$
  _say "assembling the root in $_WORK"
  # Hard links: the build only adds files (and unlinks its own), so the cached base is never changed.
  cp -al "$base" "$_WORK"
  rm -f "$_WORK/.complete"
  _say "copying $version from $prefix"
  mkdir -p "$_WORK$(dirname "$prefix")"
  tar -C "$(dirname "$prefix")" --exclude='__pycache__' --exclude="lib/python3.*/test" -cf - "$(basename "$prefix")" |
    tar -C "$_WORK$(dirname "$prefix")" -xf -
  _in_root "$_WORK" "$prefix/bin/$(basename "$(readlink -f "$(command -v "$python")")")" -m venv "$_VENV" >&2 ||
    _die "creating $_VENV in the image failed (see above)"
  _install_venv "$_WORK"
  revision=$(git -C "$_REPO_DIR" rev-parse HEAD 2>/dev/null || echo unknown)
  _say "importing into $engine as $image (about a minute)"
  tar -C "$_WORK" --exclude=./.complete -cf - . | "$engine" import \
    --change "ENV PATH=$_VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV VENV_DIR=$_VENV" \
    --change "ENV LANG=C.UTF-8" \
    --change "LABEL $_LABEL.image=cpu" \
    --change "LABEL $_LABEL.lock-sha256=$(sha256sum <"$_REPO_DIR/requirements.lock" | cut -d' ' -f1)" \
    --change "LABEL $_LABEL.python=${version#Python }" \
    --change "LABEL $_LABEL.venv=$_VENV" \
    --change "LABEL $_LABEL.base=debian-$_SUITE" \
    --change "LABEL org.opencontainers.image.revision=$revision" \
    --change "LABEL org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --change "CMD [\"bash\"]" \
    - "$image" >&2 || _die "$engine import failed (see above); check free space where $engine keeps images"
  "$engine" tag "$image" "$latest" >&2
  rm -rf --one-file-system "$_WORK"
  _WORK=""
}

# Saves IMAGE to FILE unless FILE exists: then it must already hold IMAGE's tag (kept), else an error.
_save() {
  local engine=$1 image=$2 file=$3
  if [[ -e $file ]]; then
    if tar -xOf "$file" manifest.json 2>/dev/null | grep -qF "\"${image#localhost/}" ||
      tar -xOf "$file" manifest.json 2>/dev/null | grep -qF "\"$image\""; then
      _say "$file already holds $image; kept as it is"
      return 0
    fi
    _die "$file exists and does not hold $image; choose another --save path (nothing was overwritten)"
  fi
  _say "saving $image to $file"
  "$engine" save --format docker-archive -o "$file.tmp.$$" "$image" >&2 2>/dev/null ||
    "$engine" save -o "$file.tmp.$$" "$image" >&2 || { rm -f "$file.tmp.$$"; _die "$engine save failed (see above)"; }
  mv "$file.tmp.$$" "$file"
}

main() {
  local save="" engine_opt="" name=localhost/maxtext-cpu rebuild=0 tag_only=0
  while (( $# )); do
    case $1 in
      -h | --help) _usage; exit 0 ;;
      --save) (( $# > 1 )) || _die "--save needs a file path; see '$_PROG --help'" 2; save=$2; shift ;;
      --engine)
        (( $# > 1 )) || _die "--engine needs podman or docker; see '$_PROG --help'" 2
        [[ $2 == podman || $2 == docker ]] || _die "--engine '$2' is not podman or docker" 2
        engine_opt=$2; shift ;;
      --name)
        (( $# > 1 )) || _die "--name needs an image repository, e.g. localhost/maxtext-cpu" 2
        [[ $2 =~ ^([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9][a-z0-9._/-]*$ ]] ||
          _die "--name '$2' is not an image repository (lower-case letters, digits, . _ - /; no tag); e.g. localhost/maxtext-cpu" 2
        name=$2; shift ;;
      --rebuild) rebuild=1 ;;
      --tag-only) tag_only=1 ;;
      *) _die "unknown argument '$1'; see '$_PROG --help'" 2 ;;
    esac
    shift
  done
  # --tag-only builds nothing: an option that asks for a build or its tarball would be silently dropped.
  if (( tag_only && rebuild )); then
    _die "--tag-only prints the tag and builds nothing, --rebuild forces a build; give one of them" 2
  fi
  if (( tag_only )) && [[ -n $save ]]; then
    _die "--tag-only prints the tag and builds nothing, --save writes the built image; give one of them" 2
  fi
  if [[ -n $save ]]; then
    [[ $save == *.tar ]] || _die "--save $save: the file name must end in .tar (DOCKER_IMAGE loads *.tar files)" 2
    [[ -d $(dirname "$save") ]] || _die "--save $save: directory $(dirname "$save") does not exist; create it first" 2
    save=$(cd "$(dirname "$save")" && pwd)/$(basename "$save")
  fi

  local python
  python=${PYTHON:-$("$_REPO_DIR/utils/setup_env.sh" --python)} || exit 1
  "$python" -V >/dev/null 2>&1 || _die "PYTHON=$python does not run; point PYTHON at a Python >= 3.12" 2
  local key image latest
  key=$(_image_key "$python")
  image=$name:$key latest=$name:latest
  if (( tag_only )); then echo "$image"; exit 0; fi

  local engine
  if ! engine=$(_find_engine "$engine_opt"); then
    if [[ -n $engine_opt && $engine_opt != podman ]]; then _die "$engine_opt is not installed; install it, or use --engine podman"; fi
    apt_install podman runc || exit 1
    engine=podman
  fi
  if (( ! rebuild )) && _image_exists "$engine" "$image"; then
    _say "$image is up to date (requirements.lock unchanged); nothing to build"
  else
    [[ $(id -u) == 0 ]] || _die "building needs root (debootstrap, chroot); run it as root, or load a built image with DOCKER_IMAGE=<file.tar>"
    local -a missing=()
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    command -v unshare >/dev/null 2>&1 || missing+=(util-linux)
    apt_install "${missing[@]}" || exit 1
    local cache=${IMAGE_CACHE_DIR:-$_REPO_DIR/.cache/image}
    mkdir -p "$cache" || _die "cannot create $cache; set IMAGE_CACHE_DIR to a writable directory"
    # One build at a time per cache: a second caller waits, then finds the image built.
    exec 9>"$cache/.lock"
    flock 9
    if (( rebuild )) || ! _image_exists "$engine" "$image"; then
      _build "$engine" "$python" "$image" "$latest" "$cache"
      _say "built $image"
    fi
    exec 9>&-
  fi
  if [[ -n $save ]]; then _save "$engine" "$image" "$save"; fi
  echo "$image"
}

main "$@"
