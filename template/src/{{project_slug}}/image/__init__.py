"""The project's image: what `image build` and `image push` do (computed without an engine), and
doing it with the docker SDK.
"""
