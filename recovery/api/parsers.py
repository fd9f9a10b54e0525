"""REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"] (its own module: DRF imports it while it builds
APIView, so it must not import rest_framework.views)."""

from rest_framework import exceptions, parsers


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser; JSON nested too deep for Python's parser is a 400, not a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deep.") from None
