import numpy as np
import pandas as pd


def handle(event, context):
    frame = pd.DataFrame({"x": np.arange(100)})
    return {"sum": int(frame.x.sum())}
