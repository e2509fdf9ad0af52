#!/usr/bin/python3
"""Writes the tar archives the data tests read, each the way a real writer makes it.

make_shards.py pax OUT.tar NAME=TEXT...     Python's tarfile (pax headers, its default)
make_shards.py ustar OUT.tar NAME=TEXT...   plain ustar (prefix + name for long paths)
make_shards.py gnu OUT.tar NAME=TEXT...     GNU tar --format=gnu (long names in 'L' records)
make_shards.py tokens DIR SHARDS SAMPLES    token shards DIR/shard-000.tar...: sample j of shard i
                                            is doc-i-j.tokens, uint16 LE ids 1000*i+j repeated
                                            (j % 5) + 1 times
"""
import io
import os
import struct
import subprocess
import sys
import tarfile
import tempfile


def write_tarfile(out, members, fmt):
    with tarfile.open(out, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))


def write_gnu_tar(out, members):
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in members:
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        names = [name for name, _ in members]
        subprocess.run(["tar", "--format=gnu", "--no-recursion", "-C", tmp, "-cf", out] + names,
                       check=True)


def main():
    kind, out = sys.argv[1], sys.argv[2]
    if kind == "tokens":
        shards, samples = int(sys.argv[3]), int(sys.argv[4])
        for i in range(shards):
            members = []
            for j in range(samples):
                ids = [1000 * i + j] * (j % 5 + 1)
                members.append(("doc-%d-%d.tokens" % (i, j), struct.pack("<%dH" % len(ids), *ids)))
            write_tarfile(os.path.join(out, "shard-%03d.tar" % i), members, tarfile.PAX_FORMAT)
        return
    members = []
    for item in sys.argv[3:]:
        name, text = item.split("=", 1)
        members.append((name, text.encode()))
    if kind == "gnu":
        write_gnu_tar(out, members)
    else:
        write_tarfile(out, members, tarfile.PAX_FORMAT if kind == "pax" else tarfile.USTAR_FORMAT)


if __name__ == "__main__":
    main()
