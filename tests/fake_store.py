# SPDX-License-Identifier: MIT
"""A stand-in for Mooncake's ``MooncakeDistributedStore`` where only its
buffer registration matters (kvdmabuf.mooncake's hooks):
``register_buffer`` / ``unregister_buffer`` return 0 or a negative code as
the store's do; a second registration of an address fails, as does
unregistering one that is not registered; either fails on demand. Every
call is logged in ``calls``."""


class FakeStore:
    def __init__(self):
        self.registered = {}
        self.fail_register = self.fail_unregister = False
        self.calls = []

    def register_buffer(self, addr, length):
        self.calls.append(("register", addr, length))
        if self.fail_register or addr in self.registered:
            return -1
        self.registered[addr] = length
        return 0

    def unregister_buffer(self, addr):
        self.calls.append(("unregister", addr))
        if self.fail_unregister or addr not in self.registered:
            return -1
        del self.registered[addr]
        return 0
