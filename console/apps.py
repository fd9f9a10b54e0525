from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self):
        from console import checks  # noqa: F401 - registers the deploy checks
