"""What tests share: server and lab factories' types, configs they build, data they write,
waiting helpers, and real stand-in servers. Tests import from here, never from conftest
(conftest.py only declares the fixtures) nor from another test module."""
