#!/usr/bin/python3
"""A loopback HTTP server for the shard tests and benchmark: serves files from a folder with
Range support (206, "bytes=N-" and "bytes=N-M"), 404 for missing files, and, with
--drop-after BYTES, drops the connection after that many body bytes of the first request for
each file (a server dying mid-shard), with --drop-every BYTES after that many of every request
(a link that drops now and then); --log FILE records each request. With --new-etag-each-request
every response names another ETag (a shard replaced between requests), with --no-etag none, with
--grow-each-request the file gains a byte after each request (a shard still being written);
with --range-from-zero a
Range request is answered 206 with the whole file and a Content-Range from byte 0 (a server
that resumes wrongly). Prints its port on stdout, then serves until killed.
"""
import argparse
import http.server
import os
import re
import socketserver
import sys
import threading


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = "."
    drop_after = -1
    drop_every = -1
    new_etag_each_request = False
    no_etag = False
    grow_each_request = False
    range_from_zero = False
    requests = 0
    log = None
    dropped = set()
    lock = threading.Lock()

    def log_message(self, *args):  # quiet: the tests print what matters
        pass

    def do_GET(self):
        path = os.path.join(self.root, self.path.split("?")[0].lstrip("/"))
        if not os.path.isfile(path):
            self.send_error(404, "no such shard")
            return
        if self.log:
            with self.lock, open(self.log, "a") as log:
                log.write("%s %s\n" % (self.path, self.headers.get("Range", "-")))
        size = os.path.getsize(path)
        start, end = 0, size - 1
        match = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if match and not self.range_from_zero:
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else size - 1
            if start >= size:
                self.send_error(416, "range not satisfiable")
                return
        length = end - start + 1
        with self.lock:
            Handler.requests += 1
            version = Handler.requests if self.new_etag_each_request else 1
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        if not self.no_etag:
            self.send_header("ETag", '"v%d-%d"' % (version, size))
        if match:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.end_headers()
        limit = length
        with self.lock:
            if self.drop_every >= 0:
                limit = min(length, self.drop_every)
            elif self.drop_after >= 0 and path not in self.dropped:
                self.dropped.add(path)
                limit = min(length, self.drop_after)
        with open(path, "rb") as f:
            f.seek(start)
            left = limit
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                left -= len(chunk)
        if self.grow_each_request:
            with self.lock, open(path, "ab") as f:
                f.write(b"\0")
        if limit < length:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--drop-after", type=int, default=-1)
    parser.add_argument("--drop-every", type=int, default=-1)
    parser.add_argument("--log", help="append one line per request: path and Range header")
    parser.add_argument("--new-etag-each-request", action="store_true")
    parser.add_argument("--range-from-zero", action="store_true")
    parser.add_argument("--no-etag", action="store_true")
    parser.add_argument("--grow-each-request", action="store_true")
    args = parser.parse_args()
    Handler.new_etag_each_request = args.new_etag_each_request
    Handler.range_from_zero = args.range_from_zero
    Handler.no_etag = args.no_etag
    Handler.grow_each_request = args.grow_each_request
    Handler.root = args.root
    Handler.drop_after = args.drop_after
    Handler.drop_every = args.drop_every
    Handler.log = args.log
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
