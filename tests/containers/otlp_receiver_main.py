"""An OTLP/HTTP trace receiver, run with ``python -c`` in a container of the coordinator image
(which has the ``[otel]`` extra, so the OTLP protobufs): one line per received span,
``span <name> <trace id hex>``, on stdout for the test to read. Standard library otherwise."""

import http.server
import sys

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    print(f"span {span.name} {span.trace_id.hex()}", flush=True)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:  # only the span lines on stdout
        pass


print("receiver listening on 4318", flush=True)
sys.stdout.flush()
http.server.ThreadingHTTPServer(("0.0.0.0", 4318), Receiver).serve_forever()
