"""What a training image holds, read from inside it: `python3 - < image_probe.py` prints one JSON object.

`jobkit image-info` pipes this file into a container of the image (so it must run on whatever Python the
image has: standard library only, Python >= 3.8) and adds what the engine knows (labels, size, creation).
Every lookup is a file read or a package's metadata; nothing is imported from the packages it reports, so a
broken CUDA/ROCm install cannot crash the probe. IMAGE_PROBE_ROOT (tests only) prefixes every path.

Keys: os, python, packages (name -> version, only those installed), package_count, maxtext (how it is
installed and its git commit where a checkout records one), rocm, rccl, cuda, nccl, cudnn (version or null),
commits (NAME -> hash from *_COMMIT / *_SHA / *_GIT_HASH variables), env (the image's XLA_FLAGS and friends).
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

# Distributions that decide a run's numbers, in the order the report lists them. Only installed ones appear.
KEY_PACKAGES = (
    "jax",
    "jaxlib",
    "jax-rocm7-plugin",
    "jax-rocm7-pjrt",
    "jax-rocm60-plugin",
    "jax-rocm60-pjrt",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "maxtext",
    "flax",
    "optax",
    "orbax-checkpoint",
    "grain",
    "tokamax",
    "transformer-engine",
    "transformer-engine-jax",
    "numpy",
    "ml-dtypes",
    "transformers",
    "tensorboard",
    "xprof",
    "ray",
    "prometheus-client",
    "nvidia-nccl-cu12",
    "nvidia-cudnn-cu12",
    "nvidia-cuda-runtime-cu12",
)
# Variables of the image that change what training does or records what it was built from.
ENV_KEYS = ("XLA_FLAGS", "NCCL_", "RCCL_", "HSA_", "HIP_", "ROCM_PATH", "CUDA_VERSION", "NCCL_VERSION",
            "CUDNN_VERSION", "JAX_", "MAXTEXT_REPO_DIR", "VENV_DIR")  # fmt: skip
COMMIT_RE = re.compile(r"^[A-Z0-9_]*(_COMMIT|_SHA|_GIT_HASH|_GIT_COMMIT|_REVISION)$")


def _root() -> str:
    return os.environ.get("IMAGE_PROBE_ROOT", "")


def _read(path: str) -> str | None:
    try:
        with open(_root() + path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _glob(pattern: str) -> list[str]:
    root = _root()
    return sorted(path[len(root) :] for path in glob.glob(root + pattern))


def os_release() -> str | None:
    text = _read("/etc/os-release") or ""
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?$', text, re.M)
    return match.group(1) if match else None


def packages() -> tuple[dict[str, str], int]:
    """KEY_PACKAGES that are installed -> version, and how many distributions the interpreter sees."""
    from importlib import metadata

    found, count = {}, 0
    wanted = {name.replace("_", "-").lower() for name in KEY_PACKAGES}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").replace("_", "-").lower()
        if not name:
            continue
        count += 1
        if name in wanted and name not in found:
            found[name] = dist.version
    ordered = {name: found[name] for name in KEY_PACKAGES if name in found}
    return ordered, count


def git_commit(checkout: str) -> str | None:
    """HEAD's commit of a git checkout, read from .git without a git binary (a detached HEAD, a ref, packed refs)."""
    head = _read(checkout + "/.git/HEAD")
    if not head:
        return None
    if not head.startswith("ref: "):
        return head if re.fullmatch(r"[0-9a-f]{40}", head) else None
    ref = head[5:].strip()
    loose = _read(f"{checkout}/.git/{ref}")
    if loose:
        return loose
    for line in (_read(checkout + "/.git/packed-refs") or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == ref:
            return parts[0]
    return None


def maxtext(installed: dict[str, str], environ: dict[str, str]) -> dict[str, str | None]:
    """Where MaxText comes from: the PyPI wheel, or a source checkout (MAXTEXT_REPO_DIR) and its commit."""
    checkout = environ.get("MAXTEXT_REPO_DIR", "/workspace/maxtext")
    commit = git_commit(checkout)
    if commit or _read(checkout + "/setup.py") is not None or _glob(checkout + "/pyproject.toml"):
        return {"source": f"checkout {checkout}", "version": installed.get("maxtext"), "commit": commit}
    if "maxtext" in installed:
        return {"source": "pip package", "version": installed["maxtext"], "commit": None}
    return {"source": None, "version": None, "commit": None}


def rocm_version() -> str | None:
    """ROCm's own version file: /opt/rocm/.info/version (e.g. 6.3.1-48), or TheRock's core/.info/version."""
    for path in ("/opt/rocm/.info/version", "/opt/rocm/core/.info/version", *_glob("/opt/rocm/core-*/.info/version")):
        text = _read(path)
        if text:
            return text.splitlines()[0].strip()
    header = _read("/opt/rocm/include/rocm-core/rocm_version.h") or ""
    parts = [re.search(rf"#define ROCM_VERSION_{key}\s+(\d+)", header) for key in ("MAJOR", "MINOR", "PATCH")]
    if all(parts):
        return ".".join(match.group(1) for match in parts)
    return None


def library_version(patterns: tuple[str, ...], stem: str) -> str | None:
    """The version in a shared library's file name (librccl.so.1.0.60301 -> 1.0.60301), newest first."""
    versions = []
    for pattern in patterns:
        for path in _glob(pattern):
            match = re.search(re.escape(stem) + r"\.so\.(\d+(?:\.\d+)+)$", path)
            if match:
                versions.append(match.group(1))
    versions.sort(key=lambda v: [int(x) for x in v.split(".")])
    return versions[-1] if versions else None


def cuda_version(environ: dict[str, str]) -> str | None:
    """The CUDA toolkit's version.json (cuda.version), else version.txt, else the image's CUDA_VERSION."""
    text = _read("/usr/local/cuda/version.json")
    if text:
        try:
            return json.loads(text)["cuda"]["version"]
        except (ValueError, KeyError, TypeError):
            pass
    text = _read("/usr/local/cuda/version.txt")
    if text:
        match = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
        if match:
            return match.group(1)
    return environ.get("CUDA_VERSION") or None


def commits(environ: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in sorted(environ.items()) if COMMIT_RE.match(name) and value}


def env_of_interest(environ: dict[str, str]) -> dict[str, str]:
    keys = [name for name in environ if any(name == k or (k.endswith("_") and name.startswith(k)) for k in ENV_KEYS)]
    return {name: environ[name] for name in sorted(keys)}


def probe(environ: dict[str, str] | None = None) -> dict:
    environ = dict(os.environ if environ is None else environ)
    installed, count = packages()
    lib_dirs = ("/usr/lib/x86_64-linux-gnu/", "/usr/lib/aarch64-linux-gnu/", "/usr/local/lib/", "/usr/lib64/")
    return {
        "os": os_release(),
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "packages": installed,
        "package_count": count,
        "maxtext": maxtext(installed, environ),
        "rocm": rocm_version(),
        "rccl": library_version(("/opt/rocm/lib/librccl.so.*", "/opt/rocm-*/lib/librccl.so.*"), "librccl"),
        "cuda": cuda_version(environ),
        "nccl": environ.get("NCCL_VERSION")
        or library_version(tuple(d + "libnccl.so.*" for d in lib_dirs), "libnccl")
        or installed.get("nvidia-nccl-cu12"),
        "cudnn": environ.get("CUDNN_VERSION") or installed.get("nvidia-cudnn-cu12"),
        "commits": commits(environ),
        "env": env_of_interest(environ),
    }


if __name__ == "__main__":
    json.dump(probe(), sys.stdout)
    sys.stdout.write("\n")
