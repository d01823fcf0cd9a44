"""The client side of ``datamill serve`` (stdlib HTTP, no fastapi).

* :class:`Client`: the server's datasets, iterations, progress and keys;
* :class:`Leases` and :class:`Transport`: the option groups they take (with the loader's
  :class:`~datamill.loader.Batching`);
* :class:`RemoteLoader`: the in-process Loader's batches, served (exactly once per rank in static
  mode, to whoever asks in dynamic mode), built by the server or, in direct mode, by this process
  from the dataset's client location;
* :mod:`datamill.client.torch`: ``RemoteTorchDataset`` for a ``DataLoader`` (imports torch).

The server is :mod:`datamill.serve`; the two share only the wire names in
:mod:`datamill.core.wire` and the batch building of :mod:`datamill.loader.runs`.

Examples:
    >>> from datamill.client import Client, RemoteLoader
    >>> RemoteLoader("http://127.0.0.1:8470", None, "cifar", batch_size=32).mode
    'static'
"""

from __future__ import annotations

from datamill.client.http import Client, RemoteError
from datamill.client.loader import RemoteLoader
from datamill.client.options import Leases, Transport

__all__ = ["Client", "Leases", "RemoteError", "RemoteLoader", "Transport"]
assert sorted(__all__) == __all__
