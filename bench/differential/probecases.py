import cases
cases.CASES.clear()
bodies = {
 "plain": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
 "cl-x": b"HTTP/1.1 200 OK\r\nContent-Lengthx: 2\r\n\r\nok",
 "cl-upper": b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 2\r\n\r\nok",
 "cl-dup-diff": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
 "cl-list-same": b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok",
 "cl-plus": b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nok",
 "cl-nonascii": b"HTTP/1.1 200 OK\r\nContent-Length: 2\xff\r\n\r\nok",
 "te-chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
 "te-chunked-identity": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n\r\n2\r\nok\r\n0\r\n\r\n",
 "te-two": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
 "te-upper": b"HTTP/1.1 200 OK\r\nTRANSFER-ENCODING: CHUNKED\r\n\r\n2\r\nok\r\n0\r\n\r\n",
 "te-http10": b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
 "te-cl": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n2\r\nok\r\n0\r\n\r\n",
 "1xx-conn-close": b"HTTP/1.1 100 Continue\r\nConnection: close\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
 "no-length": b"HTTP/1.1 200 OK\r\n\r\nok",
 "near-miss": b"HTTP/1.1 200 OK\r\nContent-Lengt^: 9\r\nTransfer-Encodin_: chunked\r\nContent-Length: 2\r\n\r\nok",
}
for k, v in bodies.items():
    cases.CASES.append({"name": "probe-" + k, "proto": "probe", "req": None, "resp": v})
CASES = cases.CASES
