"""The pod's services, wired: each a thread with its own connection (see
:mod:`pgworker.worker.service`), started by the supervisor and joined at its exit."""

from __future__ import annotations

from typing import Any

from ...schedules import Scheduler
from ...tasks import retry_delays
from ..lease import LeaseTerms
from ..listener import Listener
from ..pruner import Pruner, Retention
from ..reaper import Reaper, ReaperConfig
from ..registry import registry_of
from ..renewer import Renewer
from ..scheduler import SchedulerService
from ..settler import Settler


def lease_terms(settings: Any) -> LeaseTerms:
    return LeaseTerms(settings.lease_seconds, settings.effective_renew_interval)


def start_services(sup: Any) -> tuple[Settler, list[Any]]:
    """Build and start the services of supervisor ``sup``: the renewer, the settler and
    the registry always; the reaper, the pruner, the scheduler and the listener unless in
    drain mode (each as the settings enable it). Returns (the settler, every service)."""
    st = sup.settings
    common = {"connect": sup.connect, "stop": sup.stop_services, "health": sup.health, "dsn": st.dsn,
              "pass_timeout": st.statement_timeout_seconds + 5.0}
    settler = Settler(store=sup.store, metrics=sup.metrics, count=sup._count, retried=sup.retry_hold.add,
                      **common)
    renewer = Renewer(terms=lease_terms(st), tables=lambda: sup.pool.tables, holder_alive=sup.pool.holder_alive,
                      queue_name=sup._queue_name, store=sup.store, metrics=sup.metrics,
                      **{k: v for k, v in common.items() if k != "pass_timeout"})
    services: list[Any] = [renewer, settler, registry_of(sup, common)]
    if not sup.drain:
        services.append(Reaper(store=sup.store, interval=st.reap_interval_seconds, metrics=sup.metrics,
                               config=ReaperConfig(delay_for=retry_delays(sup.app.tasks)), **common))
        if st.prune:
            services.append(Pruner(store=sup.store, retention=Retention.from_settings(st),
                                   interval=st.prune_interval_seconds, metrics=sup.metrics, **common))
        if sup.schedules_on():
            services.append(SchedulerService(
                scheduler=Scheduler(sup.store, list(sup.app.schedules.values()), sup.app.tasks), metrics=sup.metrics, **common))
        if st.listen:
            services.append(Listener(dsn=st.effective_listen_dsn, channel=sup.store.channel,
                                     queues=sup.queues, lease_seconds=st.lease_seconds,
                                     announce=sup.announce, health=sup.health, metrics=sup.metrics,
                                     stop=sup.stop_services))
    for service in services:
        service.start()
    return settler, services
