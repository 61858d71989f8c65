def handle(event, context):
    return "other is fine"
