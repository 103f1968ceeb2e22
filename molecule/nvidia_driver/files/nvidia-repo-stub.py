"""Test double for NVIDIA's download server (molecule/nvidia_driver, check_fresh.yml).

Serves /usr/local/share/kvcache-test/nvidia-repo over HTTPS on 127.0.0.1:443 with a
certificate for developer.download.nvidia.com signed by a test CA the host trusts, so that
the role's key download (get_url, a HEAD request in check mode) works offline, unchanged.
Usage: python3 nvidia-repo-stub.py
"""
import functools
import http.server
import ssl

ROOT = "/usr/local/share/kvcache-test/nvidia-repo"
TLS = "/usr/local/share/kvcache-test/tls"

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(TLS + "/server.crt", TLS + "/server.key")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=ROOT)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 443), handler)
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
