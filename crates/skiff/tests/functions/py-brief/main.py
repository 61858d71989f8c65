import os

INSTANCE = os.urandom(8).hex()


def handle(event, context):
    return INSTANCE
