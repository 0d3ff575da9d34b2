"""CPU test stand-in for torchvision.

SGLang imports ``torchvision.io.decode_jpeg`` at the top of ``sglang/srt/utils/common.py`` and
transformers probes several torchvision submodules when it sees one installed. PyPI has no CPU
torchvision that imports beside the local CPU torch wheel, so the test environment installs this
package instead. Every attribute of every ``torchvision.*`` module is a placeholder that raises when
used; nothing in the tests uses vision code.
"""
import importlib.abc
import importlib.machinery
import sys

__version__ = "0.0.0+fastverify.stand.in"


class _Placeholder:
    def __init__(self, qualname):
        self._qualname = qualname

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._qualname} is a CPU test stand-in (torchvision is not "
                                  "installed)")

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return f"<stand-in {self._qualname}>"

    def __eq__(self, other):
        return isinstance(other, _Placeholder) and other._qualname == self._qualname

    def __hash__(self):
        return hash(self._qualname)


def _attribute_factory(module_name):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{module_name}.{name}")
    return __getattr__


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every ``torchvision.<x>`` import with an empty package of placeholders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _attribute_factory(module.__name__)


if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
    sys.meta_path.append(_SubmoduleFinder())

__getattr__ = _attribute_factory(__name__)
