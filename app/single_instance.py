"""One SpecChat per data folder. The first launch listens on a local socket; a later launch hands it
its request (come forward, and maybe a message to send) and quits, so two never share one
conversation file, and a live response is never taken for one cut off by a crash.

The name comes from the user and the data folder: a smoke test's scratch folder gets its own.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
from pathlib import Path
from typing import cast

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)
WAIT_MS = 2000  # a running SpecChat answers at once; this only covers a busy machine


def instance_name(data_folder: Path) -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment: the folder alone still works
        user = ""
    key = f"{user}\0{Path(data_folder).resolve()}"
    return "specchat-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def hand_over(name: str, request: dict) -> bool:
    """Send the request to the SpecChat listening on name; False if none is."""
    socket = QLocalSocket()
    socket.connectToServer(name)
    if not socket.waitForConnected(WAIT_MS):
        return False
    socket.write(json.dumps(request).encode() + b"\n")
    if not socket.waitForBytesWritten(WAIT_MS):
        log.warning("the running SpecChat did not take the request: %s", socket.errorString())
    socket.disconnectFromServer()
    return True  # it is running: never open a second one on its files


def claim(name: str, request: dict) -> InstanceServer | None:
    """This process's server when it is the first SpecChat for name; None when a running one was
    given the request instead (this process should then quit)."""
    if hand_over(name, request):
        return None
    server = InstanceServer(name)
    if server.listen():
        return server
    if hand_over(name, request):  # another launch started listening meanwhile
        return None
    QLocalServer.removeServer(name)  # a socket left by a crash: the name is taken, nobody answers
    if not server.listen():
        log.warning(
            "cannot listen as %s (%s): a second SpecChat would not be noticed", name, server.server.errorString()
        )
    return server


class InstanceServer(QObject):
    """Listens for later launches; each request arrives as requested(dict)."""

    requested = Signal(dict)

    def __init__(self, name: str, parent=None):
        super().__init__(parent)
        self.name = name
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)  # this user's launches only
        self.server.newConnection.connect(self._accept)

    def listen(self) -> bool:
        return self.server.listen(self.name)

    def is_listening(self) -> bool:
        return self.server.isListening()

    def close(self) -> None:
        self.server.close()

    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            socket = self.server.nextPendingConnection()
            socket.readyRead.connect(self._read)
            self._read(socket)  # what arrived before the connection was taken

    def _read(self, socket: QLocalSocket | None = None) -> None:
        socket = socket or cast(QLocalSocket, self.sender())  # readyRead's sender: a connection
        if not socket.canReadLine():
            return
        line = bytes(socket.readLine().data()).decode("utf-8", "replace")
        socket.readyRead.disconnect(self._read)
        socket.deleteLater()  # one request per connection
        try:
            request = json.loads(line)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            log.warning("ignored a request that was not SpecChat's: %r", line[:200])
            return
        self.requested.emit(request)
