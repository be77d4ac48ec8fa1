"""Where the functions cloudpickle sends by value were written. cloudpickle (3.1) names their
code `<dynamic-code>`, so a rank's traceback would say `File "<dynamic-code>", line 12, in
train` with no line of source; the caller maps each such function (the one it runs, what its
`__main__` defines, and the functions nested in them) to its file and lines (`source_map`),
and the rank names its frames by them (`with_sources`), as a traceback of the caller's own
would. Knows nothing of launching or of the job's files."""
import linecache
import re
import sys

#: A frame of a function cloudpickle sent by value.
_DYNAMIC = re.compile(r'File "<dynamic-code>", line (\d+), in (\S+)\n')


def _codes(obj, out, depth=0):
    """The code objects of a function or of a class's methods, and those nested in them."""
    if depth > 3:
        return
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            _codes(f, out, depth + 1)
        return
    code = getattr(obj, "__code__", None)
    if code is not None:
        stack = [code]
        while stack:
            c = stack.pop()
            out.append(c)
            stack.extend(k for k in c.co_consts if hasattr(k, "co_lines"))
    elif isinstance(obj, type):
        for v in list(vars(obj).values()):
            _codes(v, out, depth + 1)


def source_map(main):
    """`{function name: [[first line, last line, file], ...]}` for `main` and what the
    caller's `__main__` defines (JSON, for the job's spec)."""
    codes = []
    _codes(main, codes)
    module = sys.modules.get("__main__")
    for v in list(vars(module).values()) if module is not None else []:
        if getattr(v, "__module__", None) == "__main__":
            _codes(v, codes)
    where = {}
    for c in codes:
        if c.co_filename.startswith("<"):
            continue  # no file to name (an interactive prompt, exec'd text)
        lines = [n for _, _, n in c.co_lines() if n is not None]
        entry = [min(lines, default=c.co_firstlineno), max(lines, default=c.co_firstlineno), c.co_filename]
        if entry not in where.setdefault(c.co_name, []):
            where[c.co_name].append(entry)
    return where


def with_sources(text, where):
    """`text` (a traceback) with each `<dynamic-code>` frame named by its file in `where`
    (`source_map`'s), and its line of source when that file is readable here."""
    if not where or "<dynamic-code>" not in text:
        return text

    def named(m):
        lineno, name = int(m.group(1)), m.group(2)
        for first, last, filename in where.get(name, ()):
            if first <= lineno <= last:
                line = linecache.getline(filename, lineno).strip()
                return f'File "{filename}", line {lineno}, in {name}\n' + (
                    f"    {line}\n" if line else ""
                )
        return m.group(0)

    return _DYNAMIC.sub(named, text)
