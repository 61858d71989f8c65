import time


def handle(event, context):
    time.sleep(1)
    return "slept"
