"""Registry of hash policies: every ``HashPolicy`` subclass in this package's modules.

Adding a policy is adding a module here; nothing else has to be told about it (the lab's
``--policy all`` and its error messages come from ``available()``).

A policy can also live outside the package, in a user's own file: ``resolve`` takes either a
registered name or ``path/to/file.py`` (optionally ``:ClassName``). The lab and the controller
both resolve the same string, so a policy written in a user's test file is the one the
switches run, decision for decision.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from controllers.policies.base import GRANULARITIES, FlowKey, HashPolicy

__all__ = ["FlowKey", "HashPolicy", "PolicyFileError", "UnknownPolicy", "available", "get",
           "is_file_spec", "load_file", "resolve", "set_file_loader", "spec_of"]


class UnknownPolicy(ValueError):  # noqa: N818 - the lab's API name
    """A policy name that no module of this package defines."""


class PolicyFileError(UnknownPolicy):
    """A policy file that cannot be used; the message starts with ``policy-file:``."""


def _check_class(cls: type[HashPolicy], where: str) -> None:
    """The contract ``_discover`` and ``load_file`` both hold a policy class to."""
    if cls.granularity not in GRANULARITIES:
        raise TypeError(f"{where}: granularity {cls.granularity!r} is not one of "
                        f"{GRANULARITIES}")


def _discover() -> dict[str, type[HashPolicy]]:
    found: dict[str, type[HashPolicy]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not issubclass(cls, HashPolicy) or cls is HashPolicy or not cls.name:
                continue
            if cls.__module__ != module.__name__:
                continue                      # imported from elsewhere, counted there
            _check_class(cls, f"policy {cls.name!r} ({cls.__module__})")
            other = found.get(cls.name)
            if other is not None and other is not cls:
                raise TypeError(f"policy name {cls.name!r} is defined twice: "
                                f"{other.__module__} and {cls.__module__}")
            found[cls.name] = cls
    return found


_REGISTRY: dict[str, type[HashPolicy]] | None = None


def _registry() -> dict[str, type[HashPolicy]]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _discover()
    return _REGISTRY


def available() -> list[str]:
    """The known policy names, sorted."""
    return sorted(_registry())


def get(name: str) -> type[HashPolicy]:
    """The policy class called ``name``; ``UnknownPolicy`` names the field and the choices."""
    try:
        return _registry()[name]
    except (KeyError, TypeError):
        raise UnknownPolicy(f"policy: unknown policy {name!r} "
                            f"(known: {', '.join(available())})") from None


# -- policies in users' own files -------------------------------------------------------------

def is_file_spec(spec: str) -> bool:
    """True for ``file.py`` or ``file.py:Class``: a policy outside the package."""
    path = spec.rsplit(":", 1)[0] if ":" in spec else spec
    return path.endswith(".py")


def split_file_spec(spec: str) -> tuple[str, str]:
    """(the file, the class named or "") of ``file.py`` or ``file.py:Class``."""
    if spec.endswith(".py"):
        return spec, ""
    path_text, _, class_name = spec.rpartition(":")
    return path_text, class_name


def spec_of(cls: type[HashPolicy]) -> str:
    """The string that resolves back to ``cls``: its registered name, or ``file.py:Class``."""
    if cls.name and _registry().get(cls.name) is cls:
        return cls.name
    if getattr(cls, "file_spec", None):       # a policy file asked across a channel
        return str(cls.file_spec)
    source = inspect.getsourcefile(cls)
    if source is None:
        raise PolicyFileError(f"policy-file: {cls.__qualname__} has no source file: define "
                              f"the policy class at the top level of a .py file")
    if "." in cls.__qualname__:
        raise PolicyFileError(f"policy-file: {source}: {cls.__qualname__} is nested; define "
                              f"the policy class at the top level of the file")
    return f"{Path(source).resolve()}:{cls.__name__}"


_MODULES: dict[tuple[Path, int], ModuleType] = {}


def _load_module(path: Path, where: str) -> ModuleType:
    """Execute a policy file once per version of it (path and modification time)."""
    try:
        key = (path, path.stat().st_mtime_ns)
        source = path.read_text()
    except OSError as exc:
        raise PolicyFileError(f"{where}: cannot read it: {exc.strerror}") from None
    if key in _MODULES:
        return _MODULES[key]
    try:
        code = compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise PolicyFileError(f"{where}:{exc.lineno}: syntax error: {exc.msg}") from None
    digest = hashlib.sha1(f"{path}:{key[1]}".encode()).hexdigest()[:12]
    mod_name = f"fabriclab_policy_{path.stem}_{digest}"
    module = ModuleType(mod_name)
    module.__file__ = str(path)
    sys.modules[mod_name] = module          # dataclasses and pickling look modules up here
    sys.path.insert(0, str(path.parent))    # the file may import its neighbours
    try:
        exec(code, module.__dict__)
    except Exception as exc:        # any error in user code becomes one clear line
        sys.modules.pop(mod_name, None)
        raise PolicyFileError(f"{where}: importing it raised {type(exc).__name__}: "
                              f"{exc}") from None
    finally:
        sys.path.remove(str(path.parent))
    _MODULES[key] = module
    return module


def load_file(spec: str) -> type[HashPolicy]:
    """The ``HashPolicy`` subclass a user's file defines (``file.py`` or ``file.py:Class``).

    Every way the file can be unusable is one ``PolicyFileError`` naming the file (and the
    line, for a syntax error): missing, not Python, raising on import, defining no policy or
    several without a class named, a class without the ``choose`` decision method, or a bad
    ``granularity``. The controller runs this same function at start-up, so a policy that
    passes here is the policy the switches get.
    """
    path_text, class_name = split_file_spec(spec)
    where = f"policy-file: {path_text}"
    try:
        path = Path(path_text).expanduser().resolve()
    except (RuntimeError, ValueError) as exc:   # ~nosuchuser/, a NUL byte in the name
        raise PolicyFileError(f"{where}: not a usable file name: {exc}") from None
    module = _load_module(path, where)
    mod_name = module.__name__
    found = [cls for _, cls in inspect.getmembers(module, inspect.isclass)
             if issubclass(cls, HashPolicy) and cls is not HashPolicy
             and cls.__module__ == mod_name]
    if class_name:
        obj = getattr(module, class_name, None)
        if obj is None:
            raise PolicyFileError(f"{where}: defines no class {class_name!r}")
        if not (inspect.isclass(obj) and issubclass(obj, HashPolicy)):
            raise PolicyFileError(f"{where}: {class_name} is not a subclass of "
                                  f"controllers.policies.HashPolicy")
        cls = obj
    elif len(found) == 1:
        cls = found[0]
    elif not found:
        raise PolicyFileError(f"{where}: defines no subclass of controllers.policies."
                              f"HashPolicy")
    else:
        names = ", ".join(sorted(c.__name__ for c in found))
        raise PolicyFileError(f"{where}: defines several policies ({names}); name one as "
                              f"{path_text}:ClassName")
    if getattr(cls, "choose", None) is HashPolicy.choose or not callable(
            getattr(cls, "choose", None)):
        raise PolicyFileError(f"{where}: class {cls.__name__} has no decision method: "
                              f"define choose(self, flow, switch, ports) returning one of "
                              f"ports")
    try:
        _check_class(cls, f"{where}: class {cls.__name__}")
    except TypeError as exc:
        raise PolicyFileError(str(exc)) from None
    if not cls.name:
        cls.name = f"{path.stem}.{cls.__name__}"
    return cls


#: How a policy file becomes a class; ``None``: ``load_file``, in this process.
_FILE_LOADER: Callable[[str], type[HashPolicy]] | None = None


def set_file_loader(loader: Callable[[str], type[HashPolicy]] | None) -> None:
    """Make ``resolve`` turn policy files into classes with ``loader`` (``None``: by
    ``load_file`` in this process). A process running as root sets one that loads the
    file in a jail and asks it across a channel (``controllers.policies.remote``), so the
    file's code never runs with its rights."""
    global _FILE_LOADER
    _FILE_LOADER = loader


def resolve(spec: str) -> type[HashPolicy]:
    """A registered policy by name, or a user's policy class by ``file.py[:Class]``."""
    if is_file_spec(spec):
        return (_FILE_LOADER or load_file)(spec)
    return get(spec)
