# pydantic (pydantic-core), cryptography and orjson (from the manifest's packages), each
# computing something.
import orjson
import pydantic
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes


class Point(pydantic.BaseModel):
    x: int
    y: int


def handle(event, context):
    point = Point.model_validate({"x": "3", "y": 4})
    try:
        Point.model_validate({"x": "three", "y": 4})
        refused = False
    except pydantic.ValidationError:
        refused = True
    digest = hashes.Hash(hashes.SHA256())
    digest.update(b"skiff")
    fernet = Fernet(Fernet.generate_key())
    return {
        "pydantic": [point.x + point.y, refused],
        "sha256": digest.finalize().hex(),
        "fernet": fernet.decrypt(fernet.encrypt(b"round trip")).decode(),
        "orjson": orjson.loads(orjson.dumps({"a": [1, 2.5, None]})),
    }
