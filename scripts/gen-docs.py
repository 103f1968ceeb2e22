#!/usr/bin/env python
# Copyright: (c) 2026, kvcache.offload developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Generate the option reference of every module and role from their own specs.

    python scripts/gen-docs.py            # write docs/reference/ (what `make docs` runs)
    python scripts/gen-docs.py --check    # fail naming every stale page (part of `make check`)

The source is what `ansible-doc --json` reads: each module's DOCUMENTATION and RETURN
(doc fragments merged) and each role's meta/argument_specs.yml, every entry point. Two
ansible-doc runs cover the whole collection (one for the modules, one for the roles).
The hand-written pages in docs/modules/ and docs/roles/ say why and how; these pages
are the what, and nobody edits them by hand.
"""
import argparse
import difflib
import glob
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTION = "kvcache.offload"
OUT = os.path.join("docs", "reference")
COMMAND = "make docs"
SCRIPT = "scripts/gen-docs.py"

# Ansible doc markup: classic (ends at the first ")") and semantic (backslash escapes).
_MARKUP = re.compile(r"\b(RV|HORIZONTALLINE|[IBMUCLREVOP])(\(|\b)")
_SEMANTIC = ("E", "V", "O", "RV", "P")
_PLAIN_ESCAPE = re.compile(r"([\\`*<>])")
_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


# ---------------------------------------------------------------- markup -> Markdown

def _plain(text):
    """Markdown-escape text outside any markup."""
    return _UNDERSCORE.sub(r"\\_", _PLAIN_ESCAPE.sub(r"\\\1", text))


def code(text):
    """An inline code span holding `text` as it is (a longer fence when it has backticks)."""
    text = " ".join(str(text).split("\n"))
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return "%s%s%s%s%s" % (fence, pad, text, pad, fence)


def _argument(text, start, semantic):
    """(argument, end) of a markup call whose "(" is at text[start - 1]."""
    if not semantic:
        end = text.find(")", start)
        if end < 0:
            return None, start
        return text[start:end], end + 1
    out = []
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
            continue
        if char == ")":
            return "".join(out), i + 1
        out.append(char)
        i += 1
    return None, start


def _render_call(name, arg):
    if name in ("C", "V", "E", "RV", "M", "P"):
        if name == "P":
            arg = arg.split("#", 1)[0]
        return code(arg)
    if name == "O":
        if "#" in arg:
            arg = arg.split(":", 1)[-1]
        return code(arg)
    if name == "I":
        return "*%s*" % _plain(arg)
    if name == "B":
        return "**%s**" % _plain(arg)
    if name == "U":
        return "<%s>" % arg
    if name in ("L", "R"):
        label, target = (arg.split(",", 1) + [""])[:2]
        if name == "R":
            return _plain(label.strip())
        return "[%s](%s)" % (_plain(label.strip()), target.strip())
    return _plain(arg)


def markup(text):
    """Ansible doc markup (C(), O(), V(), I(), B(), U(), L(), M(), RV(), E(), P()) as Markdown."""
    text = " ".join(str(text).split())
    out = []
    pos = 0
    for match in _MARKUP.finditer(text):
        if match.start() < pos:
            continue
        name, paren = match.group(1), match.group(2)
        if name == "HORIZONTALLINE":
            out.append(_plain(text[pos:match.start()]))
            out.append(" - ")
            pos = match.end()
            continue
        if paren != "(":
            continue
        arg, end = _argument(text, match.end(), name in _SEMANTIC)
        if arg is None:
            continue
        out.append(_plain(text[pos:match.start()]))
        out.append(_render_call(name, arg))
        pos = end
    out.append(_plain(text[pos:]))
    return "".join(out)


def paragraphs(value):
    """A description (str or list of str) as a list of Markdown paragraphs."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    return [markup(item) for item in value if str(item).strip()]


def cell(text):
    """Text safe in one table cell (no line breaks, pipes escaped)."""
    return text.replace("\n", " ").replace("|", "\\|")


def value(data):
    """A default, choice or sample as inline code (JSON for anything but a plain string)."""
    if isinstance(data, str):
        return code(data) if data else code('""')
    return code(json.dumps(data, sort_keys=True))


# ---------------------------------------------------------------- tables

def _type(spec):
    kind = spec.get("type", "str")
    if spec.get("elements"):
        kind = "list of %s" % spec["elements"] if kind == "list" else "%s of %s" % (kind, spec["elements"])
    return kind


def _walk(specs, row, children, prefix=""):
    """One row per entry, nested entries after their parent as parent.child (parent[].child for lists)."""
    rows = []
    for name in sorted(specs or {}):
        spec = specs[name] or {}
        full = prefix + name
        rows.append(row(full, spec, prefix))
        nested = children(spec)
        if nested:
            rows.extend(_walk(nested, row, children, full + ("[]." if spec.get("type") == "list" else ".")))
    return rows


def _given(spec, key):
    return value(spec[key]) if spec.get(key) is not None else ""


def _option_row(full, spec, prefix):
    notes = []
    if spec.get("no_log"):
        notes.append("secret (no_log)")
    if spec.get("version_added") and not prefix:
        notes.append("added in %s" % spec["version_added"])
    text = "<br><br>".join(paragraphs(spec.get("description")))
    if notes:
        text = (text + "<br><br>" if text else "") + "*%s*" % "; ".join(notes)
    return [code(full), _type(spec), "yes" if spec.get("required") else "", _given(spec, "default"),
            ", ".join(value(c) for c in spec.get("choices") or []),
            ", ".join(code(a) for a in spec.get("aliases") or []), text]


def _return_row(full, spec, prefix):  # pylint: disable=unused-argument
    return [code(full), _type(spec), markup(spec.get("returned", "")), _given(spec, "sample"),
            "<br><br>".join(paragraphs(spec.get("description")))]


def option_rows(options):
    """Rows of the option table, suboptions after their parent."""
    return _walk(options, _option_row, lambda spec: spec.get("options") or spec.get("suboptions"))


def return_rows(returns):
    """Rows of the return value table, `contains` after its parent."""
    return _walk(returns, _return_row, lambda spec: spec.get("contains"))


def table(header, rows):
    lines = ["| %s |" % " | ".join(header), "| %s |" % " | ".join(["---"] * len(header))]
    lines.extend("| %s |" % " | ".join(cell(c) for c in row) for row in rows)
    return lines


OPTION_HEADER = ["option", "type", "required", "default", "choices", "aliases", "description"]
RETURN_HEADER = ["key", "type", "returned", "sample", "description"]


def _banner(source):
    return [
        "<!-- Generated by %s from %s; do not edit. Regenerate with `%s`. -->" % (SCRIPT, source, COMMAND),
        "",
    ]


def _generated_line(source, guide):
    return ["*Generated from %s by `%s`; do not edit. How and why: [%s](%s).*" % (
        code(source), COMMAND, "docs/" + guide.split("../", 2)[-1], guide), ""]


def _bullets(title, items):
    items = [p for item in items or [] for p in paragraphs(item)]
    if not items:
        return []
    return ["## %s" % title, ""] + ["- %s" % item for item in items] + [""]


# ---------------------------------------------------------------- pages

def module_page(name, data):
    """Markdown reference page of one module from its ansible-doc --json entry."""
    doc = data.get("doc") or {}
    source = "plugins/modules/%s.py" % name
    lines = ["# %s.%s" % (COLLECTION, name), ""] + _banner(source + " (DOCUMENTATION, RETURN)")
    lines += _generated_line(source, "../../modules/%s.md" % name)
    if doc.get("short_description"):
        lines += [markup(doc["short_description"]), ""]
    for para in paragraphs(doc.get("description")):
        lines += [para, ""]
    lines += _bullets("Requirements", doc.get("requirements"))
    attributes = doc.get("attributes") or {}
    if attributes:
        lines += ["## Attributes", ""]
        lines += table(["attribute", "support", "description"], [
            [code(key), str(attributes[key].get("support", "")),
             " ".join(paragraphs(attributes[key].get("description")))]
            for key in sorted(attributes)])
        lines.append("")
    lines += ["## Options", ""]
    rows = option_rows(doc.get("options"))
    lines += table(OPTION_HEADER, rows) if rows else ["None."]
    lines.append("")
    lines += _bullets("Notes", doc.get("notes"))
    returns = data.get("return") or {}
    lines += ["## Return values", ""]
    rows = return_rows(returns)
    lines += table(RETURN_HEADER, rows) if rows else ["None besides the common ones."]
    lines.append("")
    return "\n".join(lines)


def role_page(name, data):
    """Markdown reference page of one role, every entry point, from its ansible-doc --json entry."""
    source = "roles/%s/meta/argument_specs.yml" % name
    lines = ["# %s.%s" % (COLLECTION, name), ""] + _banner(source)
    lines += _generated_line(source, "../../roles/%s.md" % name)
    entry_points = data.get("entry_points") or {}
    order = sorted(entry_points, key=lambda e: (e != "main", e))
    if len(order) > 1:
        lines += ["Entry points: %s." % ", ".join("[%s](#entry-point-%s)" % (code(e), e)
                                                  for e in order), ""]
    for entry in order:
        spec = entry_points[entry] or {}
        lines += ["## Entry point %s" % entry, ""]
        if entry == "main":
            lines += ["Run with %s (or %s in a play's %s)." % (
                code("ansible.builtin.include_role: name=%s.%s" % (COLLECTION, name)),
                code("%s.%s" % (COLLECTION, name)), code("roles:")), ""]
        else:
            lines += ["Run with %s." % code("ansible.builtin.include_role: name=%s.%s tasks_from=%s" % (
                COLLECTION, name, entry)), ""]
        if spec.get("short_description"):
            lines += [markup(spec["short_description"]), ""]
        for para in paragraphs(spec.get("description")):
            lines += [para, ""]
        rows = option_rows(spec.get("options"))
        lines += ["### Options of %s" % code(entry), ""]
        lines += table(OPTION_HEADER, rows) if rows else ["None."]
        lines.append("")
    return "\n".join(lines)


def index_page(modules, roles):
    lines = ["# %s reference" % COLLECTION, ""] + _banner("every module's DOCUMENTATION and every role's meta/argument_specs.yml")
    lines += ["Option tables of every module and role, generated by `%s`; the pages in " % COMMAND
              + "[docs/modules](../modules/) and [docs/roles](../roles/) say why and how.", ""]
    lines += ["## Modules", ""]
    lines += table(["module", "what it does"], [
        ["[%s](modules/%s.md)" % (name, name), markup((modules[name].get("doc") or {}).get("short_description", ""))]
        for name in sorted(modules)])
    lines += ["", "## Roles", ""]
    lines += table(["role", "entry points", "what it does"], [
        ["[%s](roles/%s.md)" % (name, name),
         ", ".join(code(e) for e in sorted(roles[name].get("entry_points") or {}, key=lambda e: (e != "main", e))),
         markup(((roles[name].get("entry_points") or {}).get("main") or {}).get("short_description", ""))]
        for name in sorted(roles)])
    lines.append("")
    return "\n".join(lines)


def render(modules, roles):
    """{relative path under docs/reference: text} for ansible-doc --json data keyed by short name."""
    pages = {"README.md": index_page(modules, roles)}
    for name in modules:
        pages["modules/%s.md" % name] = module_page(name, modules[name])
    for name in roles:
        pages["roles/%s.md" % name] = role_page(name, roles[name])
    return pages


# ---------------------------------------------------------------- ansible-doc

def plugin_names(root=ROOT):
    modules = sorted(os.path.splitext(os.path.basename(p))[0]
                     for p in glob.glob(os.path.join(root, "plugins", "modules", "*.py"))
                     if not os.path.basename(p).startswith("_"))
    roles = sorted(os.path.basename(os.path.dirname(os.path.dirname(p)))
                   for p in glob.glob(os.path.join(root, "roles", "*", "meta", "argument_specs.yml")))
    return modules, roles


def _ansible_doc():
    here = os.path.join(os.path.dirname(sys.executable), "ansible-doc")
    return here if os.path.exists(here) else (shutil.which("ansible-doc") or "ansible-doc")


def ansible_doc(kind, names, root=ROOT):
    """ansible-doc --json for every name at once, keyed by short name."""
    if not names:
        return {}
    env = dict(os.environ)
    collections = os.path.join(root, "build", "collections")
    link = os.path.join(collections, "ansible_collections", *COLLECTION.split("."))
    if not os.path.lexists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(os.path.join("..", "..", "..", ".."), link)
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", collections)
    env.setdefault("ANSIBLE_HOME", os.path.join(root, "build", "ansible-home"))
    env["ANSIBLE_NOCOLOR"] = "1"
    cmd = [_ansible_doc(), "--json", "-t", kind] + ["%s.%s" % (COLLECTION, n) for n in names]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise SystemExit("gen-docs: ansible-doc --json -t %s failed (rc=%d), fix the spec it names:\n%s" % (
            kind, proc.returncode, tail))
    data = json.loads(proc.stdout)
    missing = [n for n in names if "%s.%s" % (COLLECTION, n) not in data]
    if missing:
        raise SystemExit("gen-docs: ansible-doc returned nothing for %s %s:\n%s" % (kind, ", ".join(missing), proc.stderr))
    return {n: data["%s.%s" % (COLLECTION, n)] for n in names}


def collect(root=ROOT):
    modules, roles = plugin_names(root)
    return ansible_doc("module", modules, root), ansible_doc("role", roles, root)


# ---------------------------------------------------------------- write / check

def existing(out_dir):
    found = {}
    for path in glob.glob(os.path.join(out_dir, "**", "*.md"), recursive=True):
        with open(path, encoding="utf-8") as handle:
            found[os.path.relpath(path, out_dir)] = handle.read()
    return found


def stale(pages, out_dir):
    """Sorted [(relative path, 'stale' | 'missing' | 'not generated')] of out_dir against pages."""
    have = existing(out_dir)
    problems = []
    for rel in sorted(set(pages) | set(have)):
        if rel not in have:
            problems.append((rel, "missing"))
        elif rel not in pages:
            problems.append((rel, "not generated"))
        elif have[rel] != pages[rel]:
            problems.append((rel, "stale"))
    return problems


def write(pages, out_dir):
    """Write pages, remove generated pages nothing renders any more; return the changed paths."""
    changed = []
    have = existing(out_dir)
    for rel, text in sorted(pages.items()):
        if have.get(rel) == text:
            continue
        path = os.path.join(out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        changed.append(rel)
    for rel in sorted(set(have) - set(pages)):
        os.remove(os.path.join(out_dir, rel))
        changed.append(rel)
    return changed


def report(problems, out_rel, pages, out_dir, verbose=True):
    """Human text for stale(): one line per page, the first lines of each diff, the fix."""
    lines = ["gen-docs: the generated reference is out of date:"]
    for rel, why in problems:
        lines.append("  %s/%s: %s" % (out_rel, rel, why))
    if verbose:
        have = existing(out_dir)
        for rel, why in problems:
            if why != "stale":
                continue
            diff = list(difflib.unified_diff(have[rel].splitlines(), pages[rel].splitlines(),
                                             "%s/%s (committed)" % (out_rel, rel), "(generated now)", lineterm="", n=0))
            lines.extend("    " + d for d in diff[:12])
            if len(diff) > 12:
                lines.append("    ... (%d more diff lines)" % (len(diff) - 12))
    lines.append("Fix: run `%s` and commit %s/." % (COMMAND, out_rel))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 when a page is stale")
    parser.add_argument("--out", default=os.path.join(ROOT, OUT), help="output directory (default: docs/reference)")
    args = parser.parse_args(argv)
    modules, roles = collect()
    pages = render(modules, roles)
    out_rel = os.path.relpath(args.out, ROOT)
    if args.check:
        problems = stale(pages, args.out)
        if problems:
            print(report(problems, out_rel, pages, args.out), file=sys.stderr)
            return 1
        print("gen-docs: %s is up to date (%d pages)" % (out_rel, len(pages)))
        return 0
    changed = write(pages, args.out)
    print("gen-docs: %d pages in %s, %d changed%s" % (
        len(pages), out_rel, len(changed), (": " + ", ".join(changed)) if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
