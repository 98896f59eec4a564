"""Griffe extension: drop the docstring Python gives a generated `__init__`.

Equinox modules get a dataclass `__init__` whose `__doc__` is `object.__init__`'s
("Initialize self.  See help(type(self))..."). With `merge_init_into_class` that
sentence would be appended to every such class's documentation.
"""

import griffe


_GENERATED = (object.__init__.__doc__ or "").strip()


class PlainInit(griffe.Extension):
    def on_function_instance(self, *, func: griffe.Function, **kwargs) -> None:
        docstring = func.docstring
        generated = docstring is not None and docstring.value.strip() == _GENERATED
        if func.name == "__init__" and generated:
            func.docstring = None
