import json


def handle(event, context):
    name = (event or {}).get("name", "world")
    return {"greeting": f"hello, {name}", "runtime": "python3"}


if __name__ == "__main__":
    print(json.dumps(handle({"name": "skiff"}, None)))
