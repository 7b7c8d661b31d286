"""Signing the Flight tickets the scheduler hands out (a cluster with a secret).

The state machine and the store know nothing of tickets: locations are signed
here, on their way out, in the wire messages themselves. A task launch's input
locations get shuffle tickets (any executor that holds one may fetch, for
``defaults.SHUFFLE_TICKET_TTL_S``); a finished job's result locations get result
tickets bound to the session that submitted it (the session key is the front
part of the submission's request id, kept with the job, so a restarted scheduler
binds to the same session), or, for a Flight SQL client, to its user, valid as
long as the result is kept.
See ``mangonel.security.tickets`` for the format and the checks.
"""

from __future__ import annotations

import dataclasses

from mangonel.proto import mangonel_pb2 as pb
from mangonel.security.tickets import TicketClaims, TicketSigner, session_hash, session_key_of
from mangonel.task import PartitionLocation


class TicketIssuer:
    """Puts signed tickets into outgoing location messages.

    Args:
        signer: Signs with the cluster secret.
        shuffle_ttl_s: Validity of a shuffle ticket.
        result_ttl_s: Validity of a result ticket (the scheduler's ``--result-ttl``).
    """

    def __init__(self, signer: TicketSigner, shuffle_ttl_s: float, result_ttl_s: float) -> None:
        self.signer = signer
        self.shuffle_ttl_s = shuffle_ttl_s
        self.result_ttl_s = result_ttl_s

    def _sign(self, loc: pb.PartitionLocation, job: str, expires: float, session: str) -> None:
        loc.ticket = self.signer.sign_text(
            TicketClaims(
                path=loc.path,
                job=job,
                stage=loc.stage,
                map_partition=loc.map_partition,
                partition=loc.partition,
                expires=expires,
                session=session,
            )
        )

    def sign_launch(self, msg: pb.ExecutorCommand) -> None:
        """Sign every input location of a ``LaunchTask`` message (others pass)."""
        if msg.WhichOneof("command") != "launch":
            return
        expires = self.signer.now() + self.shuffle_ttl_s
        job = msg.launch.task.attempt.job
        for inp in msg.launch.task.inputs:
            for loc in inp.locations:
                self._sign(loc, job, expires, "")

    def sign_result(self, msg: pb.JobStatus, request_id: str) -> None:
        """Sign a job's result locations for the session that submitted it."""
        expires = self.signer.now() + self.result_ttl_s
        session = session_hash(session_key_of(request_id))
        for loc in msg.result:
            self._sign(loc, msg.job_id, expires, session)

    def sign_location(self, loc: PartitionLocation, job: str, user: str) -> PartitionLocation:
        """A result location with a ticket for ``user`` (a Flight SQL client's, which
        presents a token of theirs: see ``scheduler.flightsql``; empty on a cluster
        without users, where everyone is the same anonymous admin), valid as long as
        the result is kept."""
        claims = TicketClaims(
            path=loc.path,
            job=job,
            stage=int(loc.stage),
            map_partition=loc.map_partition,
            partition=loc.partition,
            expires=self.signer.now() + self.result_ttl_s,
            user=user,
        )
        return dataclasses.replace(loc, ticket=self.signer.sign_text(claims))
