#!/usr/bin/env python3
"""The manual cannot drift from the code: every relative link in README.md and docs/*.md
resolves to a file in the repository, and every --flag the guides show for a trainer
(tessera-mlp-lm, tessera-gpt) in a code block is one its --help lists.

usage: check_docs.py REPO_ROOT [NAME=BINARY ...]   (e.g. tessera-gpt=build/examples/tessera-gpt)
"""
import glob
import os
import re
import subprocess
import sys


def main():
    root = sys.argv[1]
    programs = dict(a.split('=', 1) for a in sys.argv[2:])
    pages = [os.path.join(root, 'README.md')] + sorted(glob.glob(os.path.join(root, 'docs', '*.md')))
    bad = []
    shown = {name: {} for name in programs}
    for page in pages:
        text = open(page, encoding='utf-8').read()
        rel = os.path.relpath(page, root)
        # Links outside code: [text](target); targets with a scheme or only an anchor are not files.
        prose = re.sub(r'```.*?```', '', text, flags=re.S)
        prose = re.sub(r'`[^`\n]*`', '', prose)
        for m in re.finditer(r'\]\(([^)\s]+)\)', prose):
            target = m.group(1).split('#', 1)[0]
            if not target or re.match(r'[a-z][a-z0-9+.-]*:', target):
                continue
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page), target))):
                bad.append(f'{rel}: link to {m.group(1)} resolves to nothing')
        # Flags in code blocks, per command (a line, up to a pipe, ; or &&; backslash continues).
        for block in re.findall(r'```[a-z]*\n(.*?)```', text, flags=re.S):
            for line in block.replace('\\\n', ' ').split('\n'):
                for cmd in re.split(r'\|\||&&|[|;]', line.split('#', 1)[0] if not line.lstrip().startswith('#') else ''):
                    words = cmd.split()
                    for i, w in enumerate(words):
                        name = os.path.basename(w)
                        if name in programs:
                            for f in words[i + 1:]:
                                if f.startswith('--'):
                                    shown[name].setdefault(f.split('=', 1)[0], rel)
    for name, binary in programs.items():
        out = subprocess.run([binary, '--help'], capture_output=True, text=True, timeout=60)
        accepted = set(re.findall(r'--[a-z0-9][a-z0-9-]*', out.stdout + out.stderr))
        if not accepted:
            bad.append(f'{name} --help listed no flags (exit {out.returncode})')
            continue
        for flag, page in sorted(shown[name].items()):
            if flag not in accepted:
                bad.append(f'{page}: {name} {flag} is not a flag of the program')
        print(f'{name}: {len(shown[name])} flags shown in the guides, all accepted' if not any(
            name in b for b in bad) else f'{name}: checked {len(shown[name])} flags')
    print(f'{len(pages)} pages checked')
    for b in bad:
        print('FAIL', b)
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
