# /hang outlives the 1 s timeout; anything else answers with this instance's token.
import os
import time

INSTANCE = os.urandom(8).hex()


def handle(event, context):
    if context.path == "/hang":
        time.sleep(30)
    return INSTANCE
