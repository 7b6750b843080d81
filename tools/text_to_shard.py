#!/usr/bin/env python3
"""tessera-text-to-shard: turns text files into an llm.c / nanoGPT token shard
that tessera-gpt --data reads: a 256 x int32 header (magic 20240520, version 1,
token count) and then the tokens as uint16. Tokens are the text's bytes
(vocabulary 256), the tokenisation tessera-gpt uses for text.

Usage: text_to_shard.py OUT.bin TEXT [TEXT ...]"""
import struct
import sys


def main(argv):
    if len(argv) < 3 or argv[1] in ('-h', '--help'):
        print(__doc__)
        return 0 if len(argv) > 1 else 2
    data = b''.join(open(p, 'rb').read() for p in argv[2:])
    if len(data) >= 2**31:
        print(f'tessera: {len(data)} tokens do not fit one shard (at most 2^31 - 1); split the text', file=sys.stderr)
        return 2
    with open(argv[1], 'wb') as f:
        f.write(struct.pack('<256i', 20240520, 1, len(data), *([0] * 253)))
        f.write(struct.pack(f'<{len(data)}H', *data))
    print(f'{argv[1]}: {len(data)} byte tokens from {len(argv) - 2} file(s)')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
