"""The supported SGLang releases, read from pins.txt (standard library only).

pins.txt holds one release a line: the SGLang version first, then ``key=value`` facts about it
(the torch SGLang pins, the torch of the CPU test environment, ...). ``#`` starts a comment.

    >>> pins = load_pins()
    >>> pins["0.5.16"].facts["torch_pin"]
    '2.11.0'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PINS = REPO_ROOT / "pins.txt"


class PinsError(ValueError):
    """pins.txt is missing or malformed, or a version is not supported."""


@dataclass(frozen=True)
class Pin:
    version: str
    facts: dict = field(default_factory=dict)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.facts.get(key, default)


def parse_pins(text: str, source: str = "pins.txt") -> dict[str, Pin]:
    """Parse the text of a pins file into {version: Pin}, keeping the file's order."""
    pins: dict[str, Pin] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        version, *rest = line.split()
        if "=" in version:
            raise PinsError(f"{source}:{lineno}: a line must start with the SGLang version, got "
                            f"{version!r}")
        if version in pins:
            raise PinsError(f"{source}:{lineno}: SGLang {version} is listed twice")
        facts = {}
        for item in rest:
            key, sep, value = item.partition("=")
            if not sep or not key or not value:
                raise PinsError(f"{source}:{lineno}: expected key=value after the version, got "
                                f"{item!r}")
            if key in facts:
                raise PinsError(f"{source}:{lineno}: {key!r} given twice for SGLang {version}")
            facts[key] = value
        pins[version] = Pin(version, facts)
    if not pins:
        raise PinsError(f"{source}: no SGLang version listed")
    return pins


def load_pins(path: str | Path | None = None) -> dict[str, Pin]:
    """Read pins.txt (the repository's one by default)."""
    path = Path(path) if path is not None else DEFAULT_PINS
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PinsError(f"pin file not found: {path}") from None
    return parse_pins(text, source=str(path))


def supported_versions(path: str | Path | None = None) -> list[str]:
    return list(load_pins(path))


def pin_for(version: str, path: str | Path | None = None) -> Pin:
    """The pin of one SGLang version; an unsupported one is an error listing the supported ones."""
    pins = load_pins(path)
    if version not in pins:
        raise PinsError(
            f"SGLang {version} is not supported; supported versions: {', '.join(pins)} "
            f"(pins.txt). Install one of them, e.g. pip install --no-deps sglang=={list(pins)[-1]}"
        )
    return pins[version]
