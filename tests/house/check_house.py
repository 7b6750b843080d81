#!/usr/bin/env python3
"""The house rules, checked over the whole tree (library, models, trainers, tools,
benchmarks, tests), so that they stay kept:

- no header (.hpp, .cuh, .h) over 450 lines: a room is read in one sitting, and a
  header that grows past it is split by concept, not trimmed to the line;
- a reference trainer's trainer.hpp holds its model's hooks into the trainer kit's
  loop, under 200 lines: the loop itself is written once (trainer_kit/loop.hpp);
- nothing outside the library reaches its private floor: no `detail::` name and no
  `.engine()` from the models, trainers, tools or benchmarks.

usage: check_house.py REPO_ROOT
"""
import os
import re
import sys

HEADER_LINES = 450
TRAINER_LINES = 200
SKIP = {'.git', 'build', 'results', '__pycache__', 'subprojects'}


def files(root):
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith('build')]
        for n in names:
            yield os.path.join(top, n)


def main():
    root = os.path.abspath(sys.argv[1])
    bad, headers, trainers = [], 0, 0
    for path in files(root):
        rel = os.path.relpath(path, root)
        if not path.endswith(('.hpp', '.cuh', '.h', '.cpp', '.cu')):
            continue
        try:
            text = open(path, encoding='utf-8').read()
        except UnicodeDecodeError:
            continue
        lines = text.count('\n')
        if path.endswith(('.hpp', '.cuh', '.h')):
            headers += 1
            if lines > HEADER_LINES:
                bad.append(f'{rel}: {lines} lines, over the {HEADER_LINES}-line rule (split it by concept)')
        if os.path.basename(path) == 'trainer.hpp' and rel.startswith('examples'):
            trainers += 1
            if lines >= TRAINER_LINES:
                bad.append(f'{rel}: {lines} lines; a trainer keeps its hooks only (under {TRAINER_LINES})')
        if not rel.startswith(('include', 'tests')):
            for i, line in enumerate(text.split('\n'), 1):
                code = line.split('//', 1)[0]
                if re.search(r'(?<![A-Za-z_])detail::', code) or '.engine()' in code:
                    bad.append(f'{rel}:{i}: reaches the library\'s private floor: {line.strip()}')
    print(f'{headers} headers, {trainers} trainers checked')
    for b in bad:
        print('FAIL', b)
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
