def handle(event, context):
    return None
