from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # pika's header codec, corrected (floats, non-UTF-8 long strings, out-of-range
        # timestamps, tables nested too deep) for every process that loads Django.
        from recovery.broker import codec

        codec.install()
