"""Root of the test suite: helpers live in vectorkit.py (unit) and integration/meshkit.py."""


def pytest_report_header() -> str:
    from macula import event_loop, quic_backend

    quic = quic_backend.describe()
    loop = event_loop.loop_name()
    return f"macula: QUIC {quic['quic']} {quic['version']}; processes start on {loop}"
