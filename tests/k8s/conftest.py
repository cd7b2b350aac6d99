import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "live: needs a real cluster; runs only when EPDBENCH_KUBECONFIG is set")


from tests.k8s.fake_apiserver import cluster  # noqa: E402,F401  (fixture shared by tests/k8s)
