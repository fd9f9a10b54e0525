from tests.sso.fixtures import oidc_provider, sso, start_provider  # noqa: F401 (fixtures)
