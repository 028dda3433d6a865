"""The docs as a reader meets them: the pages' claims against the package, and the built site.

The first tests read the Markdown and the package (the extras table, the README's
set-up commands, the API page's signatures, the vmap names). The tests marked
``slow`` build the site (``mkdocs build --strict``, about 30 s; they need the
``docs`` extra and are skipped with that reason where it is missing) and check
the HTML a browser gets: rendered signatures, tables, search, the sitemap.
"""
from __future__ import annotations

import ast
import fcntl
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dist_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.\-]+(\[[^\]]*\])?", requirement).group(0)


def test_extras_table_lists_every_extra_and_its_packages() -> None:
    """Getting started's extras table has a row per extra of pyproject, naming its packages."""
    extras = _pyproject()["project"]["optional-dependencies"]
    page = (DOCS / "getting-started.md").read_text()
    rows = {}
    for line in page.splitlines():
        m = re.match(r"\| `(\w+)` \|(.*)\|(.*)\|$", line)
        if m:
            rows[m.group(1)] = m.group(2).lower()
    assert set(rows) == set(extras), (f"getting-started.md's extras table has {sorted(rows)}, "
                                      f"pyproject has {sorted(extras)}")
    aliases = {"torch": ("torch", "pytorch")}
    for extra, requirements in extras.items():
        for req in requirements:
            name = _dist_name(req).lower()
            names = aliases.get(name, (name,))
            assert any(n in rows[extra] for n in names), (
                f"getting-started.md: the `{extra}` row does not name {name}")


def _fences(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_readme_setup_is_two_commands() -> None:
    """The README's set-up: exactly two commands, the demo's and the tests', each explained
    with the time it takes."""
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set-up\n", 1)[1].split("\n## ", 1)[0]
    commands = _fences(setup, "bash")
    assert len(commands) == 2, f"README's set-up shows {len(commands)} commands, not 2"
    demo, tests = (c.strip() for c in commands)
    assert "\n" not in demo and "\n" not in tests, "each command is one line"
    assert demo.endswith("python -m anybind demo") and 'pip install -e ".[examples]"' in demo
    assert tests.endswith("python -m pytest -n 2") and 'pip install -e ".[test]"' in tests
    for command in (demo, tests):
        after = setup.split(command, 1)[1].split("```", 2)[1]   # the prose under the command
        assert re.search(r"\d+(\.\d+)? (minutes|s)\b", after), f"no time given for {command!r}"
        assert "2-core" in after or "same machine" in after, f"no machine named for {command!r}"
    assert "load average" not in setup, "measurements belong in CONTRIBUTING.md"


def test_readme_documentation_table_links_every_page() -> None:
    """The README's documentation table links every page of the guides, migration and reference."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Documentation\n", 1)[1]
    for folder in ("concepts", "guides", "migration", "reference"):
        for page in sorted((DOCS / folder).glob("*.md")):
            link = f"(docs/{folder}/{page.name})"
            assert link in table, f"README's documentation table does not link {link[1:-1]}"


def _public_docstrings():
    import anybind
    for name in anybind.__all__:
        if name in ("from_torch", "to_torch") and importlib.util.find_spec("torch") is None:
            continue
        obj = getattr(anybind, name)
        if isinstance(obj, str):
            continue
        yield f"ab.{name}", inspect.getdoc(obj) or ""
        for attr, member in vars(obj).items() if inspect.isclass(obj) else ():
            if not attr.startswith("_") and getattr(member, "__doc__", None):
                yield f"ab.{name}.{attr}", inspect.getdoc(member) or ""
    import anybind.recipes._recipes as recipes
    yield "anybind.recipes", inspect.getdoc(recipes.root) or ""


def test_docs_and_docstrings_use_the_vmap_names() -> None:
    """``vmap="vectorized"`` is the old name of ``"expand_dims"``: no page or public docstring
    uses it (saying that it is the older name is allowed)."""
    old = re.compile(r"""vmap=["']vectorized["']|``"vectorized"``(?! is its older name)""")
    found = [n for n, doc in _public_docstrings() if old.search(doc)]
    for page in [*DOCS.glob("**/*.md"), ROOT / "README.md"]:
        if old.search(page.read_text()):
            found.append(str(page.relative_to(ROOT)))
    assert not found, f"the old vmap name 'vectorized' in {found}"


def _stub_signatures() -> dict[str, str]:
    """The API page's repository-only signatures, as ``name -> (params)`` without types."""
    api = (DOCS / "reference" / "api.md").read_text()
    region = re.search(r"<!-- repository-only.*?<!-- /repository-only -->", api, re.DOTALL)
    assert region, "docs/reference/api.md has no repository-only signatures"
    (code,) = _fences(region.group(0), "python")
    out = {}
    for node in ast.parse(code).body:
        defs = [(node.name, node)] if isinstance(node, ast.FunctionDef) else []
        if isinstance(node, ast.ClassDef):
            defs = [(f"{node.name}.{f.name}", f) for f in node.body
                    if isinstance(f, ast.FunctionDef)]
        for name, f in defs:   # a class by its constructor, whose self the class's has not
            args = ast.unparse(f.args).replace("'", '"')
            out[name.removesuffix(".__init__")] = (args.removeprefix("self, ")
                                                   if name.endswith(".__init__") else args)
        if isinstance(node, ast.Assign | ast.ClassDef):
            for t in getattr(node, "targets", [ast.Name(getattr(node, "name", ""))]):
                out.setdefault(t.id, None)
    return out


def _plain(obj, drop_self: bool = False) -> str:
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    plain = sig.replace(parameters=params[1:] if drop_self else params,
                        return_annotation=inspect.Signature.empty)
    return str(plain)[1:-1].replace("'", '"')


def test_api_page_signatures_are_the_package_s() -> None:
    """docs/reference/api.md, read in the repository, gives every public name with the
    signature the package has (types left out), and every method of ``Op`` that binds a rule."""
    import anybind
    stubs = _stub_signatures()
    missing = [n for n in anybind.__all__ if n not in stubs]
    assert not missing, f"docs/reference/api.md's signatures leave out {missing}"
    for name in anybind.__all__:
        if name in ("from_torch", "to_torch") and importlib.util.find_spec("torch") is None:
            continue
        obj = getattr(anybind, name)
        if isinstance(obj, str) or name in ("HostError", "MissingRuleError", "Op"):
            continue
        want = _plain(obj)
        assert stubs[name] == want, f"api.md: {name}({stubs[name]}); the package: {name}({want})"
    for member in ("def_jvp", "def_vjp", "def_transpose", "def_fwd", "def_bwd", "def_vmap"):
        want = "self, " + _plain(getattr(anybind.Op, member), drop_self=True)
        assert stubs[f"Op.{member}"] == want, f"api.md: Op.{member}({stubs[f'Op.{member}']})"


def test_markdown_tables_are_unbroken() -> None:
    """No table row of a page follows a blank line after a table (Markdown then shows it as
    text: the command-line table's `info` row did)."""
    for page in [*DOCS.glob("**/*.md"), ROOT / "README.md"]:
        lines, fenced = page.read_text().splitlines(), False
        for i in range(2, len(lines)):
            if lines[i].startswith("```"):
                fenced = not fenced
            if (not fenced and lines[i].startswith("| ") and not lines[i - 1].strip()
                    and lines[i - 2].startswith("|")):
                pytest.fail(f"{page.relative_to(ROOT)}:{i + 1}: a blank line splits a table")


# ----------------------------------------------------------------------- the built site

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once per run: xdist's workers share one build, under a lock."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("building the site needs the docs extra (pip install -e '.[docs]')")
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    out, built = shared / "site", shared / "site.built"
    with open(shared / "site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
            proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                                   "--site-dir", str(out)], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-4000:]
            built.touch()
    return out


def _separator(site: Path) -> re.Pattern:
    index = json.loads((site / "search" / "search_index.json").read_text())
    return re.compile(index["config"]["separator"]), index["docs"]


def _terms(text: str, sep: re.Pattern) -> set[str]:
    return {t.lower() for t in sep.split(re.sub(r"<[^>]+>", " ", text)) if t}


@pytest.mark.slow
@pytest.mark.parametrize("name", [*__import__("anybind").__all__, "expand_dims", "def_vjp",
                                  "ab.check", "anybind.contrib.finufft", "nufft1"])
def test_search_finds_api_names_on_every_page_naming_them(site: Path, name: str) -> None:
    """The search index splits names as the search box splits a query (on ``_``, ``.``, camel
    case), so every page whose text names ``name`` has every term of the query."""
    sep, docs = _separator(site)
    query = _terms(name, sep)
    assert query, name
    names = re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")   # the name itself, not a longer one
    pages: dict[str, bool] = {}
    for doc in docs:
        page = doc["location"].split("#", 1)[0]
        if names.search(doc["text"]) or names.search(doc["title"]):
            found = query <= _terms(doc["title"] + " " + doc["text"], sep)
            pages[page] = pages.get(page, False) or found
    assert pages, f"no page names {name}"
    missed = [p for p, found in pages.items() if not found]
    assert not missed, f"searching {name!r} (terms {sorted(query)}) misses {missed}"


@pytest.mark.slow
def test_api_page_renders_signatures_and_tables(site: Path) -> None:
    """The API page: one rendered signature per entry (bind's overloads not repeated), the
    command-line table whole, from_torch's defaults and public return type, no
    repository-only text."""
    html = (site / "reference" / "api" / "index.html").read_text()
    assert "At a glance" not in html, "the repository-only signatures are left out of the site"
    signatures = re.findall(r'<div class="doc-signature[^"]*"', html)
    assert len(signatures) >= 17, len(signatures)
    bind = html.split('id="anybind.bind"', 1)[1].split('id="anybind.Op"', 1)[0]
    assert bind.count("doc-signature") == 1, "bind shows its typing overloads"
    assert "| <code>info" not in html and "|---" not in html, "a table shows as raw pipes"
    table = html.split('id="command-line"', 1)[1]
    assert table.count("<tr>") == 4, "the command-line table: a header and three rows"
    ft = html.split('id="anybind.from_torch"', 1)[1].split('id="anybind.to_torch"', 1)[0]
    assert "_api.Op" not in ft, "from_torch shows the private _api.Op"
    text = re.sub(r"<[^>]+>", "", ft)
    for param, default in (("shard", "None"), ("replicated", "()"), ("examples", "None")):
        row = re.search(rf"\n\s*{param}\s*\n(.*?)\n\s*(None|\(\)|required)\s*\n", text, re.S)
        assert row and row.group(2) == default, (param, row and row.group(2))


@pytest.mark.slow
def test_figures(site: Path) -> None:
    """docs/hooks.py draws the performance page's figures from the benchmark results
    (docs/gen_figures.py) into the site: vector graphics, each on the page."""
    written = sorted((site / "figures").glob("*"))
    shown = set(re.findall(r"\bfigures/([^)\s\"']+)", (DOCS / "performance.md").read_text()))
    assert {p.name for p in written} == shown, "the figures drawn are not those on the page"
    for path in written:
        assert path.suffix == ".svg", f"{path.name}: figures are vector graphics"
        assert path.stat().st_size > 10_000, path


@pytest.mark.slow
def test_site_url_sitemap_and_404(site: Path) -> None:
    """site_url is set: the sitemap lists every page and the 404 page's links are absolute."""
    import yaml
    config = yaml.safe_load(re.sub(r"!!python\S*", "", (ROOT / "mkdocs.yml").read_text()))
    url = config["site_url"]
    sitemap = (site / "sitemap.xml").read_text()
    pages = [p for p in DOCS.glob("**/*.md")]
    assert sitemap.count("<loc>") == len(pages), (sitemap.count("<loc>"), len(pages))
    assert f"<loc>{url}guides/compiled/</loc>" in sitemap
    page404 = (site / "404.html").read_text()
    assert re.search(r'href="/anybind/assets/stylesheets/main\.[0-9a-f]+\.min\.css"', page404)


@pytest.mark.slow
def test_code_lines_wrap(site: Path) -> None:
    """Code lines wrap at the column's edge rather than being cut: each line is an element
    (for the hanging indent) and the site's stylesheet turns wrapping on."""
    css = (site / "stylesheets" / "extra.css").read_text()
    assert re.search(r"\.md-typeset pre > code \{[^}]*white-space: pre-wrap", css)
    html = (site / "getting-started" / "index.html").read_text()
    assert 'id="__span-0-1"' in html
    text = re.sub(r"<[^>]+>", "", html)
    install = text[text.index("git clone"):][:300]   # the clone's block: the demo in sight
    assert "\npip install -e \".[examples]\" &amp;&amp; python -m anybind demo" in install


def test_output_approx_compares_numbers_within_a_factor_of_two() -> None:
    """``<!-- docs-test: output approx -->``: numbers within a factor of 2 (or 1e-6) match,
    the rest of the text must match exactly."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_docs import Block, check_output
    finally:
        sys.path.remove(str(ROOT / "tests"))
    shown = Block("p.md", 1, "text", "jvp  ok  1.8e-06  1.0e-03\n", [("output", ["approx"])])
    check_output(shown, "jvp  ok  2.9e-06  1.0e-03\n")
    tiny = Block("p.md", 1, "text", "vjp  ok  9.3e-08\n", [("output", ["approx"])])
    check_output(tiny, "vjp  ok  0.0e+00\n")                      # within 1e-6
    for wrong in ("jvp  ok  1.8e-06  3.0e-03\n", "vjp  ok  1.8e-06  1.0e-03\n"):
        with pytest.raises(AssertionError):
            check_output(shown, wrong)
    exact = Block("p.md", 1, "text", shown.code, [("output", [])])
    with pytest.raises(AssertionError):
        check_output(exact, "jvp  ok  2.9e-06  1.0e-03\n")


@pytest.mark.slow
def test_files_to_create_show_their_names(site: Path) -> None:
    """Each code block the reader saves as a file (``docs-test: file PATH``) shows PATH."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_docs import PAGES, blocks
    finally:
        sys.path.remove(str(ROOT / "tests"))
    checked = 0
    for page in PAGES:
        named = [b.marker("file")[0] for b in blocks(page) if b.marker("file")]
        if not named or page.name == "README.md":
            continue
        rel = page.relative_to(DOCS).with_suffix("")
        html = (site / (rel.parent if rel.name == "index" else rel) / "index.html").read_text()
        for name in named:
            assert f'<span class="filename">{name}</span>' in html, f"{rel}: {name} has no title"
            checked += 1
    assert checked >= 5, checked


def test_headings_speak_to_readers() -> None:
    """No heading of a page (the benchmarks' README included) cites the tracker's "issue N"."""
    for page in [*DOCS.glob("**/*.md"), ROOT / "README.md", ROOT / "benchmarks" / "README.md"]:
        for i, line in enumerate(page.read_text().splitlines()):
            if line.startswith("#") and re.search(r"\bissues? \d", line, re.IGNORECASE):
                pytest.fail(f"{page.relative_to(ROOT)}:{i + 1}: {line}")


def test_no_output_is_shown_twice() -> None:
    """An output block is not repeated by a plain block right after it (debugging.md's was)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_docs import PAGES, blocks
    finally:
        sys.path.remove(str(ROOT / "tests"))
    for page in PAGES:
        found = blocks(page)
        for shown, after in zip(found, found[1:]):
            if shown.marker("output") is not None and after.code.strip() == shown.code.strip():
                pytest.fail(f"{after.where} repeats the output shown at {shown.where}")
