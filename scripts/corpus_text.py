#!/usr/bin/env python3
"""Extracts English prose from unpacked Debian documentation packages into JSON lines for
`octet prepare` (one {"text": ...} object per document).

scripts/corpus.sh downloads the packages and unpacks them (dpkg -x) under one root; this script
reads that root. Each source names the package it comes from, where its files lie, and how their
markup is stripped:

  linux-doc-6.1       the kernel's Documentation/ in reStructuredText (translations and feature
                      tables left out), its sysfs ABI descriptions and the device-tree bindings
                      still in plain text (the YAML ones left out): one document per file
  python3.11-doc      the reStructuredText sources of the Python documentation (html/_sources)
  perl-doc            Perl's manual pages in POD, rendered by pod2text (Pod::Text, part of perl)
  postgresql-doc-15   PostgreSQL's manual, HTML
  sqlite3-doc         SQLite's documentation, HTML
  erlang-doc          Erlang/OTP's user guides and module reference, HTML (without the wxWidgets
                      and Java bindings' pages, which are API listings)
  git-doc             Git's manual pages and guides, AsciiDoc sources (*.txt)
  debian-reference-en the Debian Reference, English HTML, one document per chapter
  gnu-standards       the GNU coding and maintainer standards, plain text
  dict-gcide          the GNU Collaborative International Dictionary of English (Webster's 1913
                      and later additions), dictd format: consecutive entries grouped into
                      documents of about 16 KB ("pages"), so a held-out document is a page
  dict-foldoc         the Free On-line Dictionary of Computing, likewise
  jargon-text         the Jargon File, plain text, in pages of about 16 KB

The documents are written in an order shuffled with a fixed seed (--seed): `octet prepare` holds
out every ~20th document for validation in input order and the trainer evaluates on the first
validation batches, so without the shuffle the validation set would be the first package's.

Usage: corpus_text.py ROOT OUT.jsonl [--stats STATS.json] [--seed N] [--jobs N]
The markup stripping is deliberately plain (regular expressions and html.parser): the aim is text
a person would read, not a faithful rendering. Output is deterministic: sources and files in a
fixed order, so the same packages give the same bytes.
"""

import argparse
import base64
import glob
import gzip
import html.parser
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys

PAGE_BYTES = 16 * 1024  # dictionary entries are grouped into documents of about this size


def fail(msg):
    print(f"corpus_text.py: {msg}", file=sys.stderr)
    sys.exit(1)


def read_text(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    return data.decode("utf-8", errors="replace")


def tidy(text):
    """Common last step: no trailing spaces, at most one blank line in a row, no NUL/controls."""
    text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", "", text)
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


# --- reStructuredText ------------------------------------------------------------------------------

RST_ROLE = re.compile(r":[a-zA-Z0-9_:+-]+:`([^`<]*?)\s*(?:<[^`>]*>)?`")  # :ref:`text <target>`
RST_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?")  # `text <url>`_
RST_LITERAL = re.compile(r"``([^`]+)``")
RST_REF = re.compile(r"`([^`]+)`_{1,2}")
RST_ADORNMENT = re.compile(r"^([=\-~^\"'`#*+_.:<>])\1{2,}\s*$")  # heading underlines, rules
RST_TABLE_RULE = re.compile(r"^\s*[+|]?[-=+:| ]*[-=]{3,}[-=+:| ]*$")
RST_EXPLICIT = re.compile(r"^(\s*)\.\.(?:\s+|$)(?:([\w:.-]+)::(.*))?")
# Directives whose content is code, markup for the renderer or text pulled from elsewhere: dropped
# with their indented body. Every other directive (admonitions, Python's and C's description
# directives such as `.. function:: name(args)`, glossaries, topics) holds prose: its argument is
# kept as a line of text and its body stays.
RST_DROP = {"code-block", "code", "sourcecode", "literalinclude", "include", "image", "figure",
            "toctree", "kernel-doc", "kernel-feat", "kernel-abi", "kernel-include",
            "list-table", "csv-table", "table", "flat-table", "tabularcolumns", "highlight",
            "testcode", "testoutput", "testsetup", "testcleanup", "doctest", "productionlist",
            "raw", "math", "graphviz", "autosummary", "contents", "sectnum", "only", "cssclass",
            "c:namespace", "c:namespace-push", "c:namespace-pop", "moduleauthor",
            "sectionauthor", "index", "program", "currentmodule", "default-role", "role",
            "miscnews", "literal"}


def strip_rst(text):
    out, skip_indent = [], None
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:  # inside a dropped directive, comment or target
            if not stripped or indent > skip_indent:
                continue
            skip_indent = None
        if stripped.startswith("SPDX-License-Identifier"):
            continue
        m = RST_EXPLICIT.match(line)
        if m:
            name, argument = m.group(2), (m.group(3) or "").strip()
            if name is None or name in RST_DROP:  # comments, targets, footnotes, substitutions
                skip_indent = indent
            elif argument:
                out.append(m.group(1) + argument)
            continue
        if RST_ADORNMENT.match(line) or RST_TABLE_RULE.match(line):
            continue
        line = RST_ROLE.sub(r"\1", line)
        line = RST_LINK.sub(r"\1", line)
        line = RST_LITERAL.sub(r"\1", line)
        line = RST_REF.sub(r"\1", line)
        if line.rstrip().endswith("::"):  # "text::" introduces a literal block: keep "text:"
            line = line.rstrip()[:-1]
            if line.strip() == ":":
                continue
        out.append(line)
    return tidy("\n".join(out))


# --- HTML ----------------------------------------------------------------------------------------

class HTMLText(html.parser.HTMLParser):
    """Visible text of a page, block elements on their own lines; navigation and scripts dropped."""
    SKIP = {"script", "style", "head", "nav", "title"}
    BLOCK = {"p", "div", "br", "li", "dt", "dd", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
             "table", "ul", "ol", "dl", "blockquote", "section", "article", "hr"}

    def __init__(self, skip_classes):
        super().__init__(convert_charrefs=True)
        self.parts, self.depth, self.stack, self.skip_classes = [], 0, [], skip_classes

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        skip = tag in self.SKIP or any(c in self.skip_classes for c in classes)
        if tag not in ("br", "hr", "img", "meta", "link", "input", "col", "area", "base", "wbr"):
            self.stack.append((tag, skip))
            if skip:
                self.depth += 1
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        # Pop to the matching tag (HTML in the wild leaves <p> and <li> open).
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                for _, skip in self.stack[i:]:
                    self.depth -= skip
                del self.stack[i:]
                break
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.depth == 0:
            self.parts.append(data)


def strip_html(text, skip_classes=("navheader", "navfooter", "toc", "footnotes", "breadcrumbs")):
    p = HTMLText(set(skip_classes))
    p.feed(text)
    p.close()
    lines = [re.sub(r"[ \t\u00a0]+", " ", l).strip() for l in "".join(p.parts).splitlines()]
    return tidy("\n".join(lines))


# --- AsciiDoc (git-doc) --------------------------------------------------------------------------

def strip_asciidoc(text):
    out, in_block = [], None
    for line in text.splitlines():
        s = line.strip()
        if in_block:
            if s == in_block:
                in_block = None
            continue
        if re.fullmatch(r"(-{4,}|\.{4,}|/{4,}|\+{4,})", s):  # listing, literal, comment blocks
            in_block = s
            continue
        if re.fullmatch(r"[=\-~^+]{3,}", s) or s.startswith(("include::", "ifdef::", "endif::",
                                                             "ifndef::", ":", "[[", "//")):
            continue
        if re.fullmatch(r"\[.*\]", s):  # attribute lists such as [verse] or [NOTE]
            continue
        line = re.sub(r"linkgit:([\w.-]+)\[(\d)\]", r"\1(\2)", line)
        line = re.sub(r"\{litdds\}", "--", line)
        line = re.sub(r"`([^`]+)`", r"\1", line)
        out.append(line)
    return tidy("\n".join(out))


# --- dictionaries in dictd format ----------------------------------------------------------------

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64_number(s):
    n = 0
    for ch in s:
        n = n * 64 + B64.index(ch)
    return n


GCIDE_TAG_LINE = re.compile(r"^\s*\[[^\]\n]*\]\s*$", re.M)  # source tags: [1913 Webster], [PJC]
GCIDE_SYLLABLES = re.compile(r"\\[^\\\n]*\\,?")  # the headword again, in syllables: \Bad"der\,
GCIDE_XREF = re.compile(r"\{([^{}\n]*)\}")  # cross-references and italics: {Bad}


def plain_dict_entry(entry):
    """A dictd entry without the markup its formatter leaves: the source tag on a line of its
    own, the syllabified headword between backslashes, and the braces around references."""
    entry = GCIDE_TAG_LINE.sub("", entry)
    entry = GCIDE_SYLLABLES.sub("", entry)
    return tidy(GCIDE_XREF.sub(r"\1", entry))


def dictd_pages(index_path, dict_path):
    """Entries of a dictd database (its .index gives offset and length in base 64), in order of
    their place in the file, without the database's own header entries (00-database-*),
    grouped into pages of about PAGE_BYTES."""
    spans = set()
    with open(index_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
                continue
            spans.add((b64_number(parts[1]), b64_number(parts[2])))
    with (gzip.open if dict_path.endswith(".dz") else open)(dict_path, "rb") as f:
        data = f.read()
    page, size = [], 0
    for off, length in sorted(spans):
        entry = plain_dict_entry(data[off:off + length].decode("utf-8", errors="replace"))
        if not entry:
            continue
        page.append(entry)
        size += len(entry)
        if size >= PAGE_BYTES:
            yield "\n\n".join(page)
            page, size = [], 0
    if page:
        yield "\n\n".join(page)


# --- sources -------------------------------------------------------------------------------------

def files(root, pattern, exclude=()):
    found = sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    return [f for f in found if os.path.isfile(f) and not any(x in f for x in exclude)]


# One file to text; top-level functions so that a process pool can run them.
def rst_file(path):
    return strip_rst(read_text(path))


def html_file(path):
    return strip_html(read_text(path))


def asciidoc_file(path):
    return strip_asciidoc(read_text(path))


def text_file(path):
    return tidy(read_text(path))


def pod_file(path):
    r = subprocess.run(["pod2text", "--loose", path], capture_output=True)
    if r.returncode != 0 and not r.stdout:
        raise RuntimeError(f"pod2text {path}: {r.stderr.decode(errors='replace').strip()}")
    return tidy(r.stdout.decode("utf-8", errors="replace"))


POOL = None  # set in main(): the files of a source are converted in parallel, in order


def convert(fn, paths):
    return POOL.imap(fn, paths, chunksize=4)


def linux_doc(root):
    base = os.path.join(root, "usr/share/doc/linux-doc-6.1/Documentation")
    skip = ("/translations/", "/devicetree/bindings/", "/ABI/", "/features/", "/sphinx",
            "/output/", "/litmus-tests/")
    yield from convert(rst_file, files(base, "**/*.rst.gz", skip) + files(base, "**/*.txt.gz", skip))
    # Plain text with a little structure: the sysfs/ABI entries ("What:", "Description:", then
    # prose) and the device-tree bindings not yet converted to YAML.
    yield from convert(text_file, files(os.path.join(base, "ABI"), "**/*.gz") +
                       files(os.path.join(base, "devicetree/bindings"), "**/*.txt.gz"))


def python_doc(root):
    return convert(rst_file, files(os.path.join(root, "usr/share/doc/python3.11/html/_sources"),
                                   "**/*.rst.txt"))


def perl_doc(root):
    return convert(pod_file, files(os.path.join(root, "usr/share/perl/5.36.0/pod"), "*.pod"))


def postgresql_doc(root):
    return convert(html_file, files(os.path.join(root, "usr/share/doc/postgresql-doc-15/html"),
                                    "*.html"))


def sqlite_doc(root):
    return convert(html_file, files(os.path.join(root, "usr/share/doc/sqlite3"), "**/*.html"))


def erlang_doc(root):
    # The wxWidgets and Java bindings' pages are API listings with little prose.
    return convert(html_file, files(os.path.join(root, "usr/share/doc/erlang-doc"), "**/*.html",
                                    ("/lib/wx-", "/lib/jinterface-")))


def git_doc(root):
    base = os.path.join(root, "usr/share/doc/git-doc")
    return convert(asciidoc_file, files(base, "**/*.txt") + files(base, "**/*.txt.gz"))


def debian_reference(root):
    return convert(html_file, files(os.path.join(root, "usr/share/debian-reference"),
                                    "*.en.html"))


def gnu_standards(root):
    return convert(text_file, files(os.path.join(root, "usr/share/doc/gnu-standards"),
                                    "*.text.gz"))


def gcide(root):
    d = os.path.join(root, "usr/share/dictd")
    yield from dictd_pages(os.path.join(d, "gcide.index"), os.path.join(d, "gcide.dict.dz"))


def foldoc(root):
    d = os.path.join(root, "usr/share/dictd")
    yield from dictd_pages(os.path.join(d, "foldoc.index"), os.path.join(d, "foldoc.dict.dz"))


def paragraph_pages(text):
    """One long text as documents of about PAGE_BYTES, cut at blank lines."""
    page, size = [], 0
    for para in text.split("\n\n"):
        page.append(para)
        size += len(para)
        if size >= PAGE_BYTES:
            yield "\n\n".join(page)
            page, size = [], 0
    if page:
        yield "\n\n".join(page)


def jargon(root):
    text = tidy(read_text(os.path.join(root, "usr/share/doc/jargon-text/jargon.txt.gz")))
    yield from paragraph_pages(text)


# (package, extractor); the order is the order of the output.
SOURCES = [
    ("linux-doc-6.1", linux_doc),
    ("python3.11-doc", python_doc),
    ("perl-doc", perl_doc),
    ("postgresql-doc-15", postgresql_doc),
    ("sqlite3-doc", sqlite_doc),
    ("erlang-doc", erlang_doc),
    ("git-doc", git_doc),
    ("debian-reference-en", debian_reference),
    ("gnu-standards", gnu_standards),
    ("dict-gcide", gcide),
    ("dict-foldoc", foldoc),
    ("jargon-text", jargon),
]
MIN_DOC_CHARS = 200  # shorter files are index pages, stubs and link lists


def shuffle_lines(src, dst, seed):
    """The lines of src in an order drawn from seed, into dst (written whole, then renamed)."""
    with open(src, encoding="utf-8") as f:
        lines = f.readlines()
    random.Random(seed).shuffle(lines)
    with open(dst + ".part", "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(dst + ".part", dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="directory with one unpacked package per subdirectory")
    ap.add_argument("out", help="JSON lines file to write")
    ap.add_argument("--stats", help="also write per-source counts as JSON here")
    ap.add_argument("--seed", type=int, default=17, help="seed of the document order (default 17)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes that convert files (default: one per CPU)")
    args = ap.parse_args()
    global POOL
    POOL = multiprocessing.Pool(max(1, args.jobs))
    stats = []
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for package, extract in SOURCES:
            pkg_root = os.path.join(args.root, package)
            if not os.path.isdir(pkg_root):
                fail(f"{pkg_root}: package not unpacked (run scripts/corpus.sh)")
            docs = chars = nbytes = 0
            for text in extract(pkg_root):
                if len(text) < MIN_DOC_CHARS:
                    continue
                out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                docs += 1
                chars += len(text)
                nbytes += len(text.encode("utf-8"))
            if docs == 0:
                fail(f"{package}: no text found under {pkg_root} (has the package's layout changed?)")
            stats.append({"package": package, "documents": docs, "chars": chars, "bytes": nbytes})
            print(f"corpus: {package:20s} {docs:7d} documents {nbytes / 1e6:8.1f} MB",
                  file=sys.stderr, flush=True)
    shuffle_lines(tmp, args.out, args.seed)
    os.remove(tmp)
    total = sum(s["bytes"] for s in stats)
    print(f"corpus: {'total':20s} {sum(s['documents'] for s in stats):7d} documents "
          f"{total / 1e6:8.1f} MB", file=sys.stderr)
    if args.stats:
        with open(args.stats, "w", encoding="utf-8") as f:
            json.dump({"sources": stats, "bytes": total}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
