"""Run inside a namespace of the multi-host test: ``wait URL`` (until it answers),
``upload ROOT BUCKET`` (a dataset folder to the S3 store of ``AWS_ENDPOINT_URL``),
``register URL KEY PATH NAME LOCATION`` and ``journal URL KEY DATASET BATCH SEED NAME`` (joins the
dynamic iteration ``NAME``, prints its progress and done record as JSON)."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

from datamill.client import Leases


def wait(url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:  # it answered
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def upload(root: str, bucket: str) -> None:
    import os

    import pyarrow.fs as pafs

    from datamill.core.objstore import s3_filesystem

    fs = s3_filesystem(
        endpoint=os.environ["AWS_ENDPOINT_URL"],
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        allow_bucket_creation=True,
    )
    fs.create_dir(bucket)
    # a SeaweedFS that has just started answers S3 before its volume server takes writes (an
    # INTERNAL_FAILURE of an UploadPart, seen on a loaded machine): copy again until it works
    deadline = time.monotonic() + 90
    while True:
        try:
            pafs.copy_files(root, f"{bucket}/ds", destination_filesystem=fs)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def main(argv: list[str]) -> None:
    from datamill.client import Client

    cmd, *args = argv
    if cmd == "wait":
        wait(args[0])
    elif cmd == "upload":
        upload(*args)
    elif cmd == "register":
        url, key, path, name, location = args
        with Client(url, key) as c:
            c.register(path, name=name, client_location=location)
    elif cmd == "journal":
        url, key, dataset, batch, seed, name = args
        with Client(url, key) as c:
            it = c.iteration(
                dataset,
                batch_size=int(batch),
                seed=int(seed),
                leases=Leases(mode="dynamic", name=name),
            )["id"]
            print(json.dumps({"id": it, "progress": c.progress(it), "done": c.done(it)}))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
