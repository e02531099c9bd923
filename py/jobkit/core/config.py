"""MaxText run settings as this launcher sees them: `key=value` args, the yml, and which yml a job used."""

from collections.abc import Mapping, Sequence

from jobkit.core.paths import CONFIGS_DIR


def parse_overrides(args: Sequence[str]) -> dict[str, str]:
    """MaxText `key=value` arguments as a dict (last one wins)."""
    out = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key and not key.startswith("-"):
            out[key.strip()] = value
    return out


def load_yaml_keys(path: str | None) -> dict:
    """Top-level keys of a MaxText yml; {} when missing or unreadable."""
    if not path:
        return {}
    try:
        import yaml  # deferred: only needed when a yml is actually read
    except ImportError:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def default_yml(header: Mapping[str, str]) -> str | None:
    """The launcher's config for a job log's MODEL_NAME: <repo>/configs/<model>.yml (or .gpu.yml); None if absent."""
    model = header.get("MODEL_NAME")
    if not model:
        return None
    for name in (f"{model}.yml", f"{model}.gpu.yml"):
        candidate = CONFIGS_DIR / name
        if candidate.is_file():
            return str(candidate)
    return None
