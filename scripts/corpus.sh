#!/usr/bin/env bash
# The convergence corpus of docs/convergence.md (issue 17): about 110 MB of English prose from
# Debian's documentation packages, tokenized with a byte-level BPE of 32,768 ids trained on it,
# into llm.c token shards with a held-out validation split, and packed for the GPU machine.
#
#   scripts/setup.sh && scripts/build.sh && scripts/corpus.sh
#
# Not part of CI or of scripts/setup.sh (it downloads ~150 MB of packages and takes about 10
# minutes on two cores). The packages are downloaded with `apt-get download` and unpacked with
# `dpkg -x` under the corpus directory, not installed: images that exclude /usr/share/doc from
# dpkg (Docker's Debian images do) would install them empty, and nothing is left in the system.
#
# Environment: CORPUS_DIR (default .cache/octet/corpus), OCTET (default build/octet),
# VOCAB (default 32768), VAL_FRACTION (default 0.02), JOBS (default: every CPU).
# Output in $CORPUS_DIR:
#   packages.tsv              package, version and sha256 of every .deb used
#   corpus.jsonl              the extracted documents ({"text": ...}, shuffled with a fixed seed)
#   corpus-stats.json         documents and bytes per package
#   tokens-$VOCAB/            train_*.bin, val_*.bin, tokenizer.json, manifest.json (octet prepare)
#   tokens-$VOCAB.tar.xz      the same directory packed for a device call's carry (64 MiB limit),
#                             with its sha256 in tokens-$VOCAB.tar.xz.sha256
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${CORPUS_DIR:-$root/.cache/octet/corpus}
octet=${OCTET:-$root/build/octet}
vocab=${VOCAB:-32768}
val_fraction=${VAL_FRACTION:-0.02}
jobs=${JOBS:-$(nproc)}

# Bookworm's names. What each contributes and why these: scripts/corpus_text.py and
# docs/convergence.md. The versions are whatever the archive serves (security updates replace
# them), so packages.tsv records them: two runs compare only on the same tokens-*.tar.xz.
packages=(linux-doc-6.1 python3.11-doc perl-doc postgresql-doc-15 sqlite3-doc erlang-doc git-doc
          debian-reference-en gnu-standards dict-gcide dict-foldoc jargon-text)

[ -x "$octet" ] || { echo "corpus.sh: $octet not found: run scripts/build.sh first (or set OCTET)" >&2; exit 1; }
command -v pod2text >/dev/null || { echo "corpus.sh: pod2text (Debian's perl package) is missing" >&2; exit 1; }
mkdir -p "$dir/debs"

missing=()
for p in "${packages[@]}"; do
  compgen -G "$dir/debs/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "corpus: downloading ${missing[*]}"
  if ! (cd "$dir/debs" && apt-get download -q "${missing[@]}" 2>/dev/null); then
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    (cd "$dir/debs" && apt-get download -q "${missing[@]}")
  fi
fi

echo "corpus: unpacking ${#packages[@]} packages"
rm -rf "$dir/pkgs"
: > "$dir/packages.tsv.part"
for p in "${packages[@]}"; do
  debs=("$dir/debs/${p}"_*.deb)
  [ ${#debs[@]} -eq 1 ] || { echo "corpus.sh: several downloads of $p in $dir/debs; remove the old ones" >&2; exit 1; }
  mkdir -p "$dir/pkgs/$p"
  dpkg -x "${debs[0]}" "$dir/pkgs/$p"
  printf '%s\t%s\t%s\n' "$p" "$(dpkg-deb -f "${debs[0]}" Version)" \
    "$(sha256sum "${debs[0]}" | cut -d' ' -f1)" >> "$dir/packages.tsv.part"
done
mv "$dir/packages.tsv.part" "$dir/packages.tsv"

echo "corpus: extracting text"
python3 "$root/scripts/corpus_text.py" "$dir/pkgs" "$dir/corpus.jsonl" \
  --stats "$dir/corpus-stats.json" --jobs "$jobs"

tokens="$dir/tokens-$vocab"
echo "corpus: training a BPE of $vocab ids and tokenizing"
"$octet" prepare "$dir/corpus.jsonl" --train-tokenizer "$vocab" --val-fraction "$val_fraction" \
  --out "$tokens" --force
cp "$dir/packages.tsv" "$dir/corpus-stats.json" "$tokens/"

# xz at its highest preset: BPE ids in uint16 compress to about 60% (measured in
# docs/convergence.md), so the tokens travel to the GPU machine beside the octet binary within
# a device call's 64 MiB.
echo "corpus: packing $tokens"
tar -C "$dir" -cf - "tokens-$vocab" | xz -9e -T"$jobs" > "$tokens.tar.xz.part"
mv "$tokens.tar.xz.part" "$tokens.tar.xz"
(cd "$dir" && sha256sum "tokens-$vocab.tar.xz" > "tokens-$vocab.tar.xz.sha256")
du -b "$dir/corpus.jsonl" "$tokens"/*.bin "$tokens.tar.xz"
echo "corpus: done: $tokens.tar.xz"
