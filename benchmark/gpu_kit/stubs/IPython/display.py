"""`IPython.display` stand-in: HTML and display for notebooks, unused by a server."""


class HTML:
    def __init__(self, data=None, *args, **kwargs):
        self.data = data

    def _repr_html_(self):
        return self.data


def display(*objs, **kwargs):
    for obj in objs:
        print(getattr(obj, "data", obj))
