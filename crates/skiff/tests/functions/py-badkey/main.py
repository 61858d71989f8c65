def handle(event, context):
    return "never deployed"
