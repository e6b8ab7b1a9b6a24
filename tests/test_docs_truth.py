"""The docs say what is. Every repo path, python module, `python -m` command and config key
named in the guide (README.md, docs/*.md; docs/log/ keeps its commands as they were run)
and in conf/'s comments exists, and every default a page cites equals conf/.

What counts as a citation, each defined once below:
- a path: a word starting with a top folder of the checkout (`ddp_lab/command/cli.py`,
  `conf/sync/ring.yaml`, `tests/...`), a relative markdown link, or in code a `x/y.py`
  (from the checkout or from `ddp_lab/`) or a bare `name.py` (somewhere in the checkout);
  a link's `#section` is one of the target page's headings;
- a module: `ddp_lab.x.y` (a module, or a name a module defines); a command `python -m M`;
- a config key: in code, `a.b=value` or `a.b` whose first part is a section of the
  composed config (`train.lr`, `sync.prepost`); checked against the configs Hydra composes
  for every option of every group, the trainer's and the bench's;
- a default (DEFAULT_FORMS): "`key` (default V)", "`key`, default V", "`key` ... V by
  default", "`key` | `V` (default)", "`key=V`, the default", "(the default, `key=V`)",
  and a group's "the default `sync=X`"; where the group's options differ (sync.prepost),
  the options the line names decide; a site preset (cluster=) is not a default;
- a group's options listed in conf/'s defaults comments (`ddp | naive | ...`): all of them.
- architecture.md's drawn layout (its first code block) names every package and top-level
  module of ddp_lab/.

Fast: reads the files and composes configs with Hydra's API; starts no process. A failure
names the file, the line and what is missing.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CONF = REPO / "conf"
TOP = ("ddp_lab", "conf", "launchers", "scripts", "tests", "docs", ".ci")
PACKAGE = REPO / "ddp_lab"
# placeholders (`config/sync.py`, `tests/test_*.py`) and a user's own files
NOT_FILES = re.compile(r"<|\*|\{|\.\.\.|(^|/)my_")
FILE_EXTS = {"py", "md", "yaml", "yml", "json", "jsonl", "sh", "pt", "txt", "log", "bin", "out",
             "err", "sbatch", "toml", "csv", "png", "svg", "html", "gz", "cfg", "sif", "def"}


# ------------------------------------------------------------------ reading the sources
def code_spans(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every `span` and every line of a fenced or indented block."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            out.append((n, line))
        else:
            out.extend((n, m) for m in re.findall(r"`([^`]+)`", line))
    return out


def conf_comments() -> list[tuple[Path, int, str]]:
    """(file, line number, comment) of every comment in conf/."""
    out = []
    for path in sorted(CONF.rglob("*.yaml")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = re.search(r"(?:^|\s)#\s?(.*)$", line)
            if m:
                out.append((path, n, m.group(1)))
    return out


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced and indented code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("    "):
            out.append((n, line))
    return out


def sources() -> list[tuple[Path, int, str, bool]]:
    """(file, line, text, is_code) for every prose line, code span and conf/ comment."""
    out = []
    for page in PAGES:
        text = page.read_text()
        out += [(page, n, line, False) for n, line in prose(text)]
        out += [(page, n, code, True) for n, code in code_spans(text)]
    out += [(path, n, text, True) for path, n, text in conf_comments()]
    return out


def where(path: Path, n: int) -> str:
    return f"{path.relative_to(REPO)}:{n}"


def report(problems: list[str], what: str) -> None:
    assert not problems, f"{len(problems)} {what}:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------ paths
def path_exists(token: str, page: Path) -> bool:
    """In the checkout, in the package, beside the page, or made by the wheel's build (a
    path pyproject.toml names: `ddp_lab/_conf`)."""
    token = token.split("::")[0].rstrip("/")
    if any((base / token).exists() for base in (REPO, PACKAGE, page.parent)):
        return True
    build = (REPO / "pyproject.toml").read_text() + (REPO / "setup.py").read_text()
    return re.search(rf"(?<![\w/]){re.escape(token)}(?![\w/])", build) is not None


@cache
def checkout_files() -> frozenset[str]:
    return frozenset(p.name for top in TOP if (REPO / top).is_dir()
                     for p in (REPO / top).rglob("*") if ".venv" not in p.parts)


def test_every_path_named_exists():
    problems = []
    top = "|".join(re.escape(t) for t in TOP)
    for path, n, text, is_code in sources():
        tokens = re.findall(rf"(?<![\w/.$~-])((?:{top})/[\w./:<>*{{}}-]*)", text)
        if path.suffix == ".md" and not is_code:
            tokens += [t for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t]
        if is_code:
            tokens += re.findall(r"(?<![\w/.$~-])((?:\w+/)+\w+\.py)\b", text)
        for token in tokens:
            token = token.rstrip(".,:;)")
            if token and not NOT_FILES.search(token) and not path_exists(token, path):
                problems.append(f"{where(path, n)}: no such path: {token}")
        if is_code:  # a bare module file name: somewhere in the checkout
            for name in re.findall(r"(?<![\w/.-])(\w+\.py)\b", text):
                if name not in checkout_files() and not NOT_FILES.search(name):
                    problems.append(f"{where(path, n)}: no file named {name} in the checkout")
    report(sorted(set(problems)), "paths named in the docs that do not exist")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The #anchors GitHub gives a page's headings (a repeated one gets -1, -2, ...)."""
    seen, out, fenced = {}, set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = re.match(r"#{1,6}\s+(.*?)\s*#*$", line)
        if m and not fenced:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return frozenset(out)


def test_every_link_to_a_section_finds_it():
    problems, checked = [], 0
    for path, n, text, is_code in sources():
        if path.suffix != ".md" or is_code:
            continue
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            if "://" in target:
                continue
            page = (path.parent / target).resolve() if target else path
            checked += 1
            if page.is_file() and anchor not in anchors(page):
                problems.append(f"{where(path, n)}: {target or path.name} has no section "
                                f"#{anchor}")
    report(sorted(set(problems)), "links to sections that are not there")
    assert checked > 10, f"only {checked} links to a section found"


# ---------------------------------------------------------------------------- modules
def module_file(dotted: str) -> Path | None:
    base = REPO.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def bound(body: list[ast.stmt]) -> set[str]:
    """The names a block binds itself: defs, classes, assignments, imports, `__all__`."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names.update(e.value for e in ast.walk(node.value)
                             if isinstance(e, ast.Constant) and isinstance(e.value, str))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:`, `try: import`
            names |= bound(node.body) | bound(getattr(node, "orelse", []))
    return names


@cache
def defined_names(file: Path) -> frozenset[str]:
    """Every name a module binds at its top level, its classes' names and `self.x`
    attributes, and, for a package, its modules."""
    tree = ast.parse(file.read_text())
    names = bound(tree.body)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        names |= bound(cls.body)
        names.update(t.attr for t in ast.walk(cls) if isinstance(t, ast.Attribute)
                     and isinstance(t.ctx, ast.Store))
    if file.name == "__init__.py":
        names.update(p.stem for p in file.parent.glob("*.py"))
        names.update(p.name for p in file.parent.iterdir() if (p / "__init__.py").exists())
    return frozenset(names)


def module_problem(dotted: str) -> str | None:
    """None if `dotted` is a module of ddp_lab or a name one defines, else what is missing."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        file = module_file(".".join(parts[:cut]))
        if file is None:
            continue
        rest = parts[cut:]
        if not rest or (len(rest) <= 2 and all(r in defined_names(file) for r in rest)):
            return None
        return f"{'.'.join(parts[:cut])} defines no {'.'.join(rest)}"
    return f"no module {dotted}"


def test_every_module_named_exists():
    problems = []
    for path, n, text, _ in sources():
        for dotted in re.findall(r"(?<![\w/.-])ddp_lab(?:\.[A-Za-z_]\w*)+", text):
            if dotted.rsplit(".", 1)[-1] in FILE_EXTS:
                continue  # a file name (ddp_lab.yaml), not a module
            problem = module_problem(dotted)
            if problem:
                problems.append(f"{where(path, n)}: {dotted}: {problem}")
    report(sorted(set(problems)), "modules named in the docs that do not exist")


def runnable(module: str) -> bool:
    """`python -m module` runs: a package with __main__.py, or a module with a main block."""
    if not module.startswith("ddp_lab"):  # another project's: installed here
        return importlib.util.find_spec(module.split(".")[0]) is not None
    file = module_file(module)
    if file is None:
        return False
    if file.name == "__init__.py":
        return (file.parent / "__main__.py").is_file()
    return re.search(r"""__name__ == ["']__main__["']""", file.read_text()) is not None


def test_every_python_m_command_runs_a_module():
    problems = []
    for path, n, text, _ in sources():
        for module in re.findall(r"python3?\s+-m\s+([\w.]+)", text):
            module = module.rstrip(".")
            if not runnable(module):
                problems.append(f"{where(path, n)}: `python -m {module}`: no such entry point")
    report(sorted(set(problems)), "commands in the docs that name no entry point")


# ------------------------------------------------------------------------ config keys
@cache
def groups(config: str) -> dict[str, list[str]]:
    """The config groups `config`'s defaults list names, with their options in conf/."""
    defaults = OmegaConf.load(CONF / f"{config}.yaml").defaults
    out = {}
    for entry in defaults:
        if isinstance(entry, DictConfig):
            (group, _), = entry.items()
            if (CONF / group).is_dir():
                out[group] = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    return out


# a site preset's values are the site's, not the defaults; the bench shares the launchers
NOT_COMPOSED = {"config": {"cluster"}, "bench": {"cluster", "launcher"}}


@cache
def composed() -> dict[str, list[DictConfig]]:
    """The configs `python -m ddp_lab` and `python -m ddp_lab.bench` compose, as they are and
    with each other option of every group: a key is real when one of them has it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from ddp_lab.bench.config import register_bench_configs
    from ddp_lab.config import register_configs

    out = {}
    for config, register in (("config", register_configs), ("bench", register_bench_configs)):
        register()  # the schema nodes, as the entry point registers them
        overrides = [f"{group}={option}" for group, options in groups(config).items()
                     if group not in NOT_COMPOSED[config] for option in options
                     if option != group_default(config, group)]
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            out[config] = [hydra_compose(config_name=config, overrides=[o] if o else [])
                           for o in ["", *overrides]]
    return out


@cache
def sections() -> frozenset[str]:
    return frozenset(k for cfgs in composed().values() for cfg in cfgs for k in cfg)


_MISSING = object()


def lookup(cfg, key: str):
    """The value at `key`, or _MISSING; anything under an open mapping (a dict of any keys:
    launcher.env) is there."""
    node = cfg
    for part in key.split("."):
        if isinstance(node, DictConfig):
            if part not in node:  # a typed dict (launcher.env) takes any key
                return None if node._metadata.object_type is dict else _MISSING
            node = node._get_node(part)._value() if OmegaConf.is_missing(node, part) else node[part]
        elif isinstance(node, ListConfig) and part.isdigit():
            node = node[int(part)]
        else:
            return _MISSING
    return node


def values(key: str, config: str | None = None) -> list:
    """`key`'s value in every composed config that has it (`config`: only that one's)."""
    return list(values_by_option(key, config).values())


def values_by_option(key: str, config: str | None = None) -> dict[str, object]:
    """`key`'s value in each composed config that has it, by the option chosen for the
    key's own group (`sync.prepost`: {"ring": False, "hierarchical": True})."""
    head = key.split(".")[0]
    out = {}
    for name, cfgs in composed().items():
        if config not in (None, name):
            continue
        for cfg in cfgs:
            value = lookup(cfg, key)
            if value is not _MISSING:
                option = cfg[head].get("name", "") if isinstance(cfg.get(head), DictConfig) else ""
                out.setdefault(f"{name}:{option}", value)
    return out


KEY = r"(?<![\w.$/{-])([a-z][a-z_0-9]*(?:\.[A-Za-z_][\w]*)+)"


@cache
def torch_distributed_names() -> frozenset[str]:
    """What `dist.` names in torch's API (`dist.all_reduce`), read from its sources."""
    package = Path(importlib.util.find_spec("torch").origin).parent / "distributed"
    return frozenset().union(*(defined_names(package / f) for f in
                               ("__init__.py", "distributed_c10d.py")))


def python_name(key: str) -> bool:
    """`a.b` that is Python, not a key: `dist.all_reduce` (torch.distributed's), a name in
    ddp_lab (`train.train`, `bench.submit.resolve_bench`), a CONSTANT or a Class."""
    head, rest = key.split(".", 1)
    return (key != key.lower()
            or (head == "dist" and rest.split(".")[0] in torch_distributed_names()))


def cited_keys(text: str) -> list[str]:
    """The config keys a code span or comment names: `a.b=...` and `a.b` with `a` a section
    (not a Python name); `key` stands for any key (`bench.key=value`)."""
    keys = []
    for key, assigned in re.findall(KEY + r"(?:(=)|\b(?!\())", text):
        head, last = key.split(".", 1)[0], key.rsplit(".", 1)[-1]
        if head not in sections() or head == "hydra" or last in FILE_EXTS or last == "key":
            continue
        if assigned or not python_name(key):
            keys.append(key)
    return keys


def key_problems(items) -> tuple[list[str], set[str]]:
    """(a line per key cited in `items` (file, line, text, is_code: prose and code alike)
    that no composed config has, the keys checked)."""
    problems, checked = [], set()
    for path, n, text, _ in items:
        for key in cited_keys(text):
            checked.add(key)
            if not values(key):
                problems.append(f"{where(path, n)}: no config key {key} (conf/, any group option)")
    return problems, checked


def test_every_config_key_named_exists():
    problems, checked = key_problems(sources())
    report(sorted(set(problems)), "config keys in the docs that no config has")
    assert len(checked) > 50, f"only {len(checked)} keys found: is the pattern still right?"


def test_a_made_up_key_fails_in_prose_and_in_code():
    """A key no config has is caught wherever a page names it, even where its last part
    names a module of ddp_lab (`timing.clock`: ddp_lab/timing/clock.py, no config key) or its
    words are plain prose; a real key and a Python call are not."""
    page = REPO / "docs" / "timing.md"
    made_up = ["Set timing.clock=wall to time with the wall clock.",  # prose, assigned
               "the clock is timing.clock, read once per step",  # prose, named
               "`timing.clock`", "python -m ddp_lab timing.clock=wall",  # code
               "`sync.bucket_size=25`"]
    for text in made_up:
        for is_code in (False, True):
            problems, _ = key_problems([(page, 1, text, is_code)])
            assert problems, f"{text!r} (is_code={is_code}) passed"
    for text in ["`timing.trace_steps=3`", "train.lr sets the rate", "`dist.all_reduce(t)`",
                 "`ddp_lab.timing.clock`", "see ddp_lab/timing/clock.py"]:
        problems, _ = key_problems([(page, 1, text, False)])
        assert not problems, (text, problems)


# --------------------------------------------------------------------------- defaults
V = r"`?([^\s`,;)]+)`?"
DEFAULT_FORMS = [  # (regex with groups key and value, which way round)
    re.compile(rf"`{KEY}`(?:(?!`[a-z]+\.)[^.`]){{0,60}}?\(?default:?\s+(?:is\s+)?{V}"),
    re.compile(rf"`{KEY}`(?:(?!`[a-z]+\.)[^.`]){{0,60}}?\(`?([\w.%-]+)`? by default"),
    re.compile(rf"`{KEY}`\s*\|\s*{V}\s*\(default\)"),
    re.compile(rf"`{KEY}=([^`\s]+)`\s*(?:\(the default\)|\(default\)|, the default)"),
    re.compile(rf"the default, `{KEY}=([^`\s]+)`"),
]


def same(cited: str, value) -> bool:
    cited = cited.strip("'\"").lower()
    if value is None:
        return cited in ("null", "none", "unset")
    if isinstance(value, bool):
        return cited == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(cited) == float(value)
        except ValueError:
            return False
    if isinstance(value, ListConfig):
        return cited.strip("[]").replace(" ", "") == ",".join(map(str, value)).lower()
    return cited == str(value).lower()


def group_default(config: str, group: str) -> str | None:
    for entry in OmegaConf.load(CONF / f"{config}.yaml").defaults:
        if isinstance(entry, DictConfig) and group in entry:
            return str(entry[group])
    return None


def test_every_default_cited_is_confs():
    problems, checked = [], 0
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for form in DEFAULT_FORMS:
                for key, cited in form.findall(line):
                    if key.split(".")[0] not in sections():
                        continue
                    checked += 1
                    by_option = values_by_option(key)
                    # options differ (sync.prepost: ring's false, hierarchical's true): the
                    # options the line names decide, if it names any
                    named = {o: v for o, v in by_option.items() if o.split(":")[1]
                             and re.search(rf"\b{re.escape(o.split(':')[1])}\b", line)}
                    found = list((named or by_option).values())
                    if not found:
                        problems.append(f"{where(page, n)}: `{key}`: no such config key")
                    elif not any(same(cited, v) for v in found):
                        problems.append(f"{where(page, n)}: `{key}` default cited as {cited}, "
                                        f"conf/ has {sorted(set(map(str, found)))}")
            # a group's default: "the default `sync=ring`", "`sync=ddp` (the default)"
            for group, option in re.findall(r"[Tt]he default,? `([a-z]+)=(\w+)`", line) + \
                    re.findall(r"`([a-z]+)=(\w+)`\s*(?:\(the default\)|, the default)", line):
                if group in groups("config") and group_default("config", group) != option:
                    problems.append(f"{where(page, n)}: `{group}=` default cited as {option}, "
                                    f"conf/config.yaml has {group_default('config', group)}")
    report(sorted(set(problems)), "defaults the docs cite that conf/ does not have")
    assert checked > 15, f"only {checked} defaults found: are DEFAULT_FORMS still right?"


# --------------------------------------------------------------- conf/'s own comments
def test_conf_defaults_comments_list_every_option():
    problems = []
    for config in ("config", "bench"):
        file = CONF / f"{config}.yaml"
        for n, line in enumerate(file.read_text().splitlines(), 1):
            m = re.match(r"\s*- (\w+): \S+\s+#(.*)", line)
            if not m or "|" not in m.group(2) or m.group(1) not in groups(config):
                continue
            group, comment = m.groups()
            listed = set(re.findall(r"(\w+)(?:\s*\([^)|]*\))?\s*\|", comment))
            listed |= set(re.findall(r"\|\s*(\w+)", comment))
            missing = sorted(set(groups(config)[group]) - listed)
            unknown = sorted(listed - set(groups(config)[group]))
            if missing or unknown:
                problems.append(f"{where(file, n)}: {group}'s list misses {missing}, "
                                f"names no option {unknown} (conf/{group}/)")
    report(problems, "option lists in conf/ comments that are not conf/'s options")


def test_the_layout_drawn_names_every_part_of_the_package():
    page = REPO / "docs" / "architecture.md"
    drawn = re.search(r"```\n(.*?)```", page.read_text(), re.S)
    assert drawn, f"{page.relative_to(REPO)}: no layout drawn (a ``` block)"
    words = set(re.findall(r"[\w.]+/?", drawn.group(1)))
    parts = [p.name + "/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    parts += [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py",)]
    missing = sorted(p for p in parts if p not in words)
    assert not missing, (f"docs/architecture.md's layout (its first ``` block) does not name "
                         f"{missing}: draw each in the room it belongs to")
