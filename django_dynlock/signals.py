"""Django signals for lock events. ``sender`` is the LockClient class.

Every signal has the keyword arguments ``client`` (the LockClient), ``alias`` and
``key``. Connect with ``@receiver(lock_lost)`` as usual. Signals about a lease that
ends in the background (``lock_lost`` from a failed heartbeat) are sent from the
heartbeat thread; django-dynlock closes that thread's database connections after
sending, so receivers may use the ORM without leaking connections.
"""

from django.dispatch import Signal

#: A lease was acquired. Also: ``lease``, ``token``, ``holder`` (dict), ``waited`` (seconds).
lock_acquired = Signal()

#: A lease was released by its holder. Also: ``lease``, ``token``, ``holder``, ``held`` (seconds).
lock_released = Signal()

#: An acquire gave up on a busy lock. Also: ``holder`` (a LeaseInfo, or None), ``waited``.
lock_busy = Signal()

#: A renewal failed; the lease is still valid for ``lease.remaining()``.
#: Also: ``lease``, ``token``, ``holder``, ``error``.
lock_at_risk = Signal()

#: A held lease ended before release. Also: ``lease``, ``token``, ``holder``,
#: ``reason`` ("expired", "taken", "broken", "released", "closed", "fork").
lock_lost = Signal()

#: An operator broke a lease. Also: ``token`` (the token given, or None), ``reason``, ``by``.
lock_broken = Signal()
