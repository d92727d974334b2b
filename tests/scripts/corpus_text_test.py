#!/usr/bin/env python3
"""Tests of scripts/corpus_text.py (the convergence corpus' text extraction) on small inputs made
here: what each markup stripper keeps and drops, the dictd reader (offsets in base 64, header
entries left out, pages), the seeded shuffle, and the one-line error for a package that is missing.
Standard library only; run by ctest (label cpu)."""

import base64
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import corpus_text as ct  # noqa: E402


def b64(n):
    digits = ""
    while True:
        digits = ct.B64[n % 64] + digits
        n //= 64
        if n == 0:
            return digits


class StripRst(unittest.TestCase):
    def test_keeps_prose_and_drops_markup(self):
        src = "\n".join([
            ".. SPDX-License-Identifier: GPL-2.0",
            ".. _target:",
            "",
            "Title of the page",
            "=================",
            "",
            "See :ref:`the other page <other>` and ``literal`` and `a link <http://x>`_.",
            "",
            ".. code-block:: c",
            "",
            "   int dropped_code;",
            "",
            ".. note::",
            "",
            "   The note's prose stays.",
            "",
            ".. function:: frobnicate(x)",
            "",
            "   Frobnicates *x*.",
            "",
            "A literal block follows::",
            "",
            "   kept_literal()",
            "",
            ".. this is a comment",
            "   spanning two lines",
            "",
            "+-----+-----+",
            "| a   | b   |",
            "+=====+=====+",
            "Last line.",
        ])
        out = ct.strip_rst(src)
        for kept in ["Title of the page", "See the other page and literal and a link.",
                     "The note's prose stays.", "frobnicate(x)", "Frobnicates *x*.",
                     "A literal block follows:", "kept_literal()", "| a   | b   |", "Last line."]:
            self.assertIn(kept, out)
        for dropped in ["SPDX", "_target", "=====", "dropped_code", "code-block", ".. note",
                        "comment", "spanning", "+-----", "::"]:
            self.assertNotIn(dropped, out)


class StripHtml(unittest.TestCase):
    def test_visible_text_in_blocks(self):
        page = ("<html><head><title>T</title><style>p {}</style></head><body>"
                "<div class='navheader'>Prev Next</div><h1>Heading</h1>"
                "<p>First &amp; second<br>line<p>Unclosed paragraph"
                "<script>var x = 1;</script><ul><li>one<li>two</ul></body></html>")
        self.assertEqual(ct.strip_html(page),
                         "Heading\n\nFirst & second\nline\nUnclosed paragraph\n\none\ntwo")


class StripAsciidoc(unittest.TestCase):
    def test_blocks_and_attributes(self):
        src = "\n".join(["git-frob(1)", "===========", ":doctype: manpage", "[verse]",
                         "Use linkgit:git-log[1] and `--oneline`.", "----", "$ git frob",
                         "----", "// a comment", "End."])
        self.assertEqual(ct.strip_asciidoc(src),
                         "git-frob(1)\nUse git-log(1) and --oneline.\nEnd.")


class Dictd(unittest.TestCase):
    def test_entries_in_file_order_as_pages(self):
        with tempfile.TemporaryDirectory() as d:
            entries = ["00-database-info\n   header text\n",
                       "Bad \\Bad\\, a.\n   Wanting good qualities; see {Evil}.\n   [1913 Webster]\n",
                       "Badge \\Badge\\, n.\n   A mark or token.\n   [PJC]\n"]
            data = "".join(entries).encode()
            offsets, pos = [], 0
            for e in entries:
                offsets.append((pos, len(e.encode())))
                pos += len(e.encode())
            with gzip.open(os.path.join(d, "x.dict.dz"), "wb") as f:
                f.write(data)
            # The index is sorted by headword, not by offset; "Bad" is listed twice.
            index = [("00-database-info", *offsets[0]), ("Badge", *offsets[2]),
                     ("Bad", *offsets[1]), ("bad", *offsets[1])]
            with open(os.path.join(d, "x.index"), "w") as f:
                for word, off, n in index:
                    f.write(f"{word}\t{b64(off)}\t{b64(n)}\n")
            pages = list(ct.dictd_pages(os.path.join(d, "x.index"), os.path.join(d, "x.dict.dz")))
        self.assertEqual(pages, ["Bad  a.\n   Wanting good qualities; see Evil.\n\n"
                                 "Badge  n.\n   A mark or token."])

    def test_base64_numbers(self):
        self.assertEqual(ct.b64_number("A"), 0)
        self.assertEqual(ct.b64_number("BA"), 64)
        self.assertEqual(ct.b64_number(b64(123456789)), 123456789)


class Shuffle(unittest.TestCase):
    def test_same_seed_same_order_and_all_lines(self):
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "in.jsonl")
            lines = [json.dumps({"text": f"doc {i}"}) + "\n" for i in range(50)]
            with open(src, "w") as f:
                f.writelines(lines)
            outs = []
            for seed in (17, 17, 18):
                dst = os.path.join(d, f"out{len(outs)}.jsonl")
                ct.shuffle_lines(src, dst, seed)
                with open(dst) as f:
                    outs.append(f.readlines())
        self.assertEqual(outs[0], outs[1])
        self.assertNotEqual(outs[0], outs[2])
        self.assertNotEqual(outs[0], lines)
        self.assertEqual(sorted(outs[0]), sorted(lines))


class Errors(unittest.TestCase):
    def test_missing_package_is_one_line(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "corpus_text.py"), d,
                                os.path.join(d, "out.jsonl"), "--jobs", "1"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 1)
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
            self.assertIn("linux-doc-6.1: package not unpacked (run scripts/corpus.sh)", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "out.jsonl")))


if __name__ == "__main__":
    unittest.main(verbosity=1)
