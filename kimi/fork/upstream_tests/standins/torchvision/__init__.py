"""Stand-in for torchvision (``kimi.fork.upstream_tests.standins``): every submodule and name imports, as a
placeholder class, and nothing of it runs - only so that upstream's test modules that import it at load are
collected. A test that uses torchvision fails on the placeholders, alike patched and pristine."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0+stub"


class _Meta(type):
    """Placeholder classes: any attribute is another placeholder (``InterpolationMode.BICUBIC``)."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")


def _placeholder(name):
    return _Meta(name, (), {})


def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every ``torchvision.*`` an empty package whose names are placeholders."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__getattr__ = _module_getattr
