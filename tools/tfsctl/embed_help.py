#!/usr/bin/env python3
"""embed_help.py HELP_TXT HELP_H: turn help.txt (a section per tfsctl
command: a line "== COMMAND", then the text `tfsctl COMMAND --help`
prints) into a C header of one table, help_texts[], of {name, text}.
Lines starting with "#" are comments; a section's blank lines at its end
are dropped, and its text ends with one newline."""
import sys


def c_string(text):
    out = []
    for line in text.splitlines(keepends=True):
        esc = line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        out.append('\t "%s"' % esc)
    return "\n".join(out)


def main(src, dst):
    sections, name, lines = [], None, []
    for raw in open(src, encoding="utf-8"):
        if raw.startswith("#"):
            continue
        if raw.startswith("== "):
            if name is not None:
                sections.append((name, lines))
            name, lines = raw[3:].strip(), []
        elif name is not None:
            lines.append(raw.rstrip("\n"))
        elif raw.strip():
            sys.exit("%s: text before the first '== COMMAND' line" % src)
    if name is not None:
        sections.append((name, lines))
    names = [n for n, _ in sections]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        sys.exit("%s: more than one section for %s" % (src, ", ".join(sorted(dup))))
    with open(dst, "w", encoding="utf-8") as f:
        f.write("/* Made from help.txt by embed_help.py: edit help.txt. */\n")
        f.write("static const struct help_text {\n\tconst char *name, *text;\n} help_texts[] = {\n")
        for n, body in sections:
            while body and not body[-1].strip():
                body.pop()
            if not body:
                sys.exit("%s: section '%s' has no text" % (src, n))
            f.write('    {"%s",\n%s},\n' % (n, c_string("\n".join(body) + "\n")))
        f.write("};\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: embed_help.py HELP_TXT HELP_H")
    main(sys.argv[1], sys.argv[2])
