# What `random` draws in this instance; the sleep keeps the instance busy, so a second
# call at the same time needs another instance.
import random
import time


def handle(event, context):
    draws = [random.random() for _ in range(4)]
    time.sleep(1)
    return {"random": draws}
