"""Private data kept private: the engine that masks headers, JSON paths and text (``engine``,
no models), the policy that says which rules reach which caller and message (``policy``), and
the trial of a rule against stored samples before it is saved (``trial``). The rules and
break-glass unmasks themselves are models in ``recovery.models.masking``."""
