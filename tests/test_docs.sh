#!/bin/bash
# Every mount option is documented, with the default the code uses.
# The option names come from the code: the OPT list of fs/cmdline.c (what -o
# takes) and the key table of fs/opts.c (what a config file's [tensorfs]
# section takes). Each option must have an entry in `tensorfs --help`, in
# the option table of README.md and under OPTIONS in man/tensorfs.8; each
# config key one in man/tensorfs.conf.5. No place may document an option
# the code does not take, docs/tensorfs.conf.example included.
# The defaults come from the code too: a DEF_* constant assigned just
# before the option's string is parsed in fs/opts.c (sizes compared as
# bytes, a DEF_*_MS of an option in seconds divided by 1000), the choice
# that an enumerated option's parse accepts without changing the default,
# the log level DEF_LOG_LEVEL names. --help, the README and tensorfs(8)
# must each state that default ("default 32", "info (default)", --help's
# "(100)"), and any default a place states, tensorfs.conf(5) included,
# must be it, as must a key that docs/tensorfs.conf.example leaves
# commented out ("; threads = 32"). Defaults that the code computes (dram,
# dirty, s3_object, nvme) are checked as phrases against the constants
# they come from.
# Nothing is mounted.
# Usage: test_docs.sh SOURCE_ROOT BUILD_ROOT (TENSORFS= overrides the binary)
# Exit: 0 pass, 1 fail, 77 skip (no tensorfs binary or no python3).
set -u
SRC=$1
TFS=${TENSORFS:-$2/fs/tensorfs}
[ -x "$TFS" ] || { echo "SKIP: no tensorfs binary at $TFS"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
. "$(dirname "$0")/lib_scratch.sh" docs
"$TFS" --help >"$W/help" 2>&1 || fail "tensorfs --help exited $?: $(cat "$W/help")"

python3 - "$SRC" "$W/help" <<'PY'
import glob, re, sys

src, help_path = sys.argv[1], sys.argv[2]
read = lambda p: open(src + "/" + p).read()
main_c, opts_c, meta_h = read("fs/cmdline.c"), read("fs/opts.c"), read("fs/meta.h")
problems = []
bad = problems.append

# --- the code: option names, config keys, fields ---------------------------
opt_field = {}  # option -> its string field in struct fs_config
for name, field in re.findall(r'OPT\("([a-z0-9_]+)=%s",\s*(\w+)\)', main_c):
    opt_field[name] = field
for name in re.findall(r'FUSE_OPT_KEY\("([a-z0-9_]+)=",', main_c):
    opt_field[name] = name + "_s"  # remote=: added by opt_proc
flags = re.findall(r'\{"([a-z0-9_]+)",\s*offsetof\(struct fs_config', main_c)
options = sorted(opt_field) + sorted(flags)
table = re.search(r"keys\[\] = \{(.*?)\};", opts_c, re.S).group(1)
ini_keys = set(re.findall(r'\{"([a-z0-9_]+)",\s*&c->', table))
ini_keys |= set(re.findall(r'strcmp\(name, "([a-z0-9_]+)"\) == 0', opts_c))
if len(options) < 30 or len(ini_keys) < 30:
    sys.exit("FAIL: read %d options and %d config keys from fs/cmdline.c and "
             "fs/opts.c: the code's shape changed, fix this test" % (len(options), len(ini_keys)))
for k in sorted(ini_keys - set(options)):
    bad("config key %s is no -o option" % k)

# --- the code: defaults ------------------------------------------------------
defines = dict(re.findall(r"^#define (\w+)\s+(.+?)\s*(?:/\*.*)?$", opts_c + meta_h, re.M))

def value(macro):
    v = defines[macro].strip()
    while v in defines:
        v = defines[v].strip()
    if v.startswith('"'):
        return v.strip('"')
    return eval(re.sub(r"(\d+)U?L*", r"\1", v))

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

def size(text):
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:i?B)?", text)
    return int(m.group(1)) * SIZE_UNITS[m.group(2)] if m else None

default = {}  # option -> the value a doc must state (a str)
choices = {}  # option -> the words its parse accepts
kind = {}     # option -> "size", "number" or "word"
field_opt = {f: o for o, f in opt_field.items()}
lines = opts_c.split("\n")
for i, line in enumerate(lines):
    m = re.search(r"(?:c->|\*)\w+ = (DEF_\w+);", line)
    if not m:
        continue
    nxt = " ".join(lines[i + 1:i + 3])
    f = re.search(r"c->(\w+_s)\b", nxt)
    if not f or f.group(1) not in field_opt:
        continue
    o, v = field_opt[f.group(1)], value(m.group(1))
    if "fs_parse_size(c->%s," % f.group(1) in opts_c:
        kind[o], default[o] = "size", str(v)
    elif m.group(1).endswith("_MS") and not o.endswith("_ms"):
        kind[o], default[o] = "number", str(v // 1000)  # seconds
    else:
        kind[o], default[o] = "number", str(v)
# The whole-number options' table: {"name", c->name_s, &c->name, DEF_..., min, max, why}.
for o, macro in re.findall(r'\{"([a-z0-9_]+)",\s*c->\w+_s,\s*&c->\w+,\s*(DEF_\w+),', opts_c):
    if o in opt_field:
        kind[o], default[o] = "number", str(value(macro))
# The word options: opt_choice(c->name_s, "name", words, ...), words[0] the default.
for o, arr in re.findall(r'opt_choice\(c->\w+_s,\s*"([a-z0-9_]+)",\s*(\w+),', opts_c):
    words = re.findall(r'\{"([\w-]+)",', re.search(r"%s\[\] = \{(.*?)\};" % arr, opts_c, re.S).group(1))
    choices[o], kind[o], default[o] = set(words), "word", words[0]
# The on/off options: opt_switch(c->name_s, "name", default, ...).
for o, d in re.findall(r'opt_switch\(c->\w+_s,\s*"([a-z0-9_]+)",\s*(true|false),', opts_c):
    choices[o], kind[o], default[o] = {"on", "off"}, "word", "on" if d == "true" else "off"
for o, f in opt_field.items():
    words = re.findall(r'strcasecmp\(c->%s, levels' % f, opts_c) and \
        re.search(r"levels\[\] = \{([^}]*)\}", opts_c)
    if words:  # log_level: DEF_LOG_LEVEL indexes the names
        names = re.findall(r'"(\w+)"', words.group(1))
        choices[o], kind[o] = set(names), "word"
        default[o] = names[int(default[o])]
        continue
    said = re.findall(r'strcmp\(c->%s, "([\w-]+)"\)( != 0)?' % f, opts_c)
    if said and o not in default:  # not readahead's "0"
        choices[o] = {w for w, _ in said}
        left = [w for w, ne in said if ne]  # the one that keeps the default
        if left:
            kind[o], default[o] = "word", left[-1]
    m = re.search(r"c->%s \? c->%s : (DEF_\w+)" % (f, f), opts_c)
    if m:
        kind[o], default[o] = "word", value(m.group(1))
for o in ("threads", "queue_depth", "flush_delay_ms", "sync_interval_ms", "dirty_expire_ms",
          "block", "readahead", "log_level", "dedup", "cache_policy", "prefetch", "checksum",
          "cuda", "region", "lock_wait", "remote_timeout", "nvme_engine"):
    if o in opt_field and o not in default:
        sys.exit("FAIL: found no default of %s in fs/opts.c: the code's shape changed, "
                 "fix this test" % o)

# Defaults the code computes: phrases each place must hold, from constants.
phrases = {}
if "DRAM_SHARE_OF_AVAILABLE" in defines:
    share = value("DRAM_SHARE_OF_AVAILABLE")
    phrases["dram"] = [{2: "half", 4: "quarter"}.get(share, "1/%d" % share)]
if "DEF_S3_OBJECT_DRAM_SHARE" in defines:
    lo, hi = value("MIN_DEF_S3_OBJECT") >> 20, value("MAX_DEF_S3_OBJECT") >> 20
    obj = value("DEF_S3_OBJECT_DRAM_SHARE")
    phrases["s3_object"] = [r"(dram/%d|sixteenth)" % obj if obj == 16 else "dram/%d" % obj,
                            r"\b%dM" % lo, r"\b%dM" % hi]
nvme_dirs = re.findall(r'"(?:%s)?(/[\w./]*tensorfs)"', opts_c)
phrases["nvme"] = [re.escape(d.lstrip("/") if d.startswith("/.") else d) for d in nvme_dirs]
# the flusher keeps 1/CLEAN_LOW_SHARE to twice that clean: the reserve
tiers = "".join(open(p).read() for p in sorted(glob.glob(src + "/tiers/*.[ch]")))
clean = re.search(r"#define CLEAN_LOW_SHARE (\d+)", tiers)
if not clean:
    sys.exit("FAIL: found no CLEAN_LOW_SHARE in tiers/: the code's shape changed, fix this test")
phrases["dirty"] = [r"1/%d\b" % (int(clean.group(1)) // 2)]

# --- the documents: entries as (names, text) -------------------------------
def roff(text):
    """man page source to plain text, one line per source line."""
    out = []
    for line in text.split("\n"):
        line = line.replace("\\-", "-").replace("\\ ", " ").replace("\\e", "\\")
        line = re.sub(r"\\f[BIRP]|\\c$|\\&", "", line)
        m = re.match(r"\.(B|I|BR|RB|BI|IB|IR|RI|SM)\s+(.*)", line)
        if m:
            words = re.findall(r'"([^"]*)"|(\S+)', m.group(2))
            words = [a or b for a, b in words]
            line = (" " if m.group(1) in ("B", "I", "SM") else "").join(words)
        out.append(line)
    return out

def names_in(text, known):
    return [w for w in re.findall(r"[a-z][a-z0-9_]*", text) if w in known]

known = set(options) | {"allow_other"}

def help_entries():
    text = open(help_path).read()
    part = text.split("tensorfs options", 1)[1].split("\n\n", 1)[0]
    entries = []
    for line in part.split("\n")[1:]:
        m = re.match(r"    -o (\S+(?: \S+=)*)(?:\s{2,}(.*)|$)", line)
        if m:
            entries.append([names_in(re.sub(r"=\S*", "=", m.group(1)), known), m.group(2) or ""])
        elif entries:
            entries[-1][1] += " " + line.strip()
        else:
            bad("--help: cannot read the line %r" % line)
    return entries

def readme_entries():
    text = read("README.md")
    start = text.index("| option | default | meaning |")
    entries = []
    for line in text[start:].split("\n")[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("\0", "|")
                 for c in line.replace("\\|", "\0").strip("|").split("|")]
        if len(cells) < 3:  # a | escaped inside a cell: \|
            bad("README: a row of the option table has %d cells: %s" % (len(cells), line))
            continue
        heads = re.findall(r"`([a-z0-9_]+)(?:=[^`]*)?`", cells[0])
        entries.append([heads, cells[1].replace("`", "") + " :: " + cells[-1]])
    return entries

def man_entries(path, section, stop):
    lines = roff(read(path))
    i = lines.index(section)
    entries, cur = [], None
    while i + 1 < len(lines) and not lines[i + 1].startswith(stop):
        i += 1
        line = lines[i]
        if line == ".TP":
            cur = [names_in(re.sub(r"(?<==)\S*", "", lines[i + 1]), known), ""]
            entries.append(cur)
            i += 1
        elif cur is not None and not line.startswith((".PP", ".RS", ".RE", ".nf", ".fi")):
            cur[1] += " " + line
    return entries

places = {
    "--help": help_entries(),
    "README": readme_entries(),
    "tensorfs.8": man_entries("man/tensorfs.8", ".SS tensorfs options", ".SS"),
    "tensorfs.conf.5": man_entries("man/tensorfs.conf.5", ".SH KEYS", ".SH"),
}

# --- the checks --------------------------------------------------------------
def plausible(o, v):
    if kind.get(o) == "word":
        return v in choices.get(o, {default.get(o)}) or v == default.get(o)
    return size(v) is not None

def same(o, v):
    if kind[o] == "size":
        return size(v) == int(default[o])
    return v == default[o]

def stated(place, o, text):
    """The defaults text states: README's default cell, else the phrases
    'default[:] V', 'V (default', 'V: the default', and in --help '(V)'."""
    if place == "README":
        first = re.match(r"\s*([^\s;,(]+)", text.split(" :: ")[0])
        return [first.group(1)] if first else []
    found = re.findall(r"\bdefault:?\s+(?:is\s+)?([^\s,;:)]+?)\.?(?=[\s,;:)]|$)", text, re.I)
    found += re.findall(r"([^\s(]+)\s+\((?:the )?default(?=[),:])", text)
    found += re.findall(r"\(([^\s(;,:]+): the default", text)
    if place == "--help":
        found += re.findall(r"\(([^\s(;,:)]+)(?=[;,)])", text)
    return [v for v in found if plausible(o, v)]

for place, entries in places.items():
    allowed = ini_keys if place == "tensorfs.conf.5" else set(options)
    for names, _ in entries:
        for n in names:
            if n not in allowed and n != "allow_other":
                bad("%s documents %s, which the code does not take%s" % (
                    place, n, " in a config file" if place == "tensorfs.conf.5" else ""))
    want = sorted(ini_keys) if place == "tensorfs.conf.5" else options
    for o in want:
        mine = [t for names, t in entries if o in names]
        if not mine and o not in default:  # s3_bw= in the text of remote_bw='s entry
            mine = [t for names, t in entries if re.search(r"\b%s=" % o, t)]
        if not mine:
            bad("%s does not document %s" % (place, o))
            continue
        text = " ".join(mine)
        if o in default:
            vals = stated(place, o, text)
            if not vals and place != "tensorfs.conf.5":
                bad("%s states no default for %s (the code's: %s)" % (place, o, default[o]))
            for v in vals:
                if not same(o, v):
                    bad("%s gives %s's default as %s; the code's is %s" % (place, o, v, default[o]))
        for p in phrases.get(o, []):
            if place != "tensorfs.conf.5" or re.search(r"\bdefault", text, re.I):
                if not re.search(p, text):
                    bad("%s: the default of %s does not say %r, as the code computes it"
                        % (place, o, p))

# The example config: keys the file takes; a key left commented out shows
# its default.
section = None
for line in read("docs/tensorfs.conf.example").split("\n"):
    m = re.match(r";?\s*\[(\w+)\]", line)
    if m:
        section = m.group(1)
    m = re.match(r"(;?)\s*([a-z0-9_]+) = (\S+)$", line)
    if not m or section != "tensorfs":
        continue
    commented, k, v = m.groups()
    if k not in ini_keys:
        bad("docs/tensorfs.conf.example sets %s, which a config file does not take" % k)
    elif commented and k in default and not same(k, v):
        bad("docs/tensorfs.conf.example shows %s = %s; the code's default is %s" % (k, v, default[k]))

for p in problems:
    print("FAIL: " + p)
if problems:
    sys.exit(1)
print("PASS: %d options, %d config keys, %d constant defaults, each documented in "
      "--help, README, tensorfs.8 (and tensorfs.conf.5) and agreeing"
      % (len(options), len(ini_keys), len(default)))
PY
