# The python3 handler contract: what the handler sees of the request, what it returns.
import sys


def handle(event, context):
    print(f"py-contract saw {context.method} {context.path}")
    print("py-contract to stderr", file=sys.stderr)
    if context.path == "/raise":
        raise RuntimeError("py-contract raised on purpose")
    if context.path == "/status":
        return {
            "statusCode": 201,
            "headers": {"X-From-Handler": "python"},
            "body": {"created": True},
        }
    return {
        "event": event,
        "method": context.method,
        "path": context.path,
        "query": context.query,
        "header": context.headers.get("x-test"),
        "request_id": context.request_id,
    }
