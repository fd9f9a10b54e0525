from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from recovery.broker import codec as amqp_floats

        amqp_floats.install()
