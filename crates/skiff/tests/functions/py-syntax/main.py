def handle(event, context)
    return "never"
