"""The service schema: blobs, submissions, attempts, verdicts, variants.

Revision ID: 0001
Revises:
"""
from alembic import op
import sqlalchemy as sa

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "submissions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("submitter", sa.String(200)),
        sa.Column("received", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16)),
        sa.Column("reason", sa.Text),
        sa.Column("exit_code", sa.Integer),
        sa.Column("first_id", sa.Integer, sa.ForeignKey("submissions.id")),
        sa.Column("relation", sa.String(16)),
        sa.Column("bundle_id", sa.String(200)),
        sa.Column("options", sa.Text, nullable=False),
        sa.Column("finished", sa.Float),
    )
    op.create_index("ix_submissions_hash", "submissions", ["hash"])
    op.create_index("ix_submissions_state", "submissions", ["state"])
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("submission_id", sa.Integer, sa.ForeignKey("submissions.id"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("worker", sa.String(200)),
        sa.Column("node", sa.String(200)),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("finished", sa.Float),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("message", sa.Text),
        sa.UniqueConstraint("submission_id", "number", name="uq_attempts_submission_number"),
    )
    op.create_index("ix_attempts_submission_id", "attempts", ["submission_id"])
    op.create_table(
        "verdicts",
        sa.Column("submission_id", sa.Integer, sa.ForeignKey("submissions.id"), primary_key=True),
        sa.Column("attempt_id", sa.Integer, sa.ForeignKey("attempts.id"), nullable=False, unique=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("device", sa.Text),
        sa.Column("elapsed", sa.Float),
        sa.Column("payload", sa.Text),
        sa.Column("report_html", sa.Text),
    )
    op.create_table(
        "variants",
        sa.Column("submission_id", sa.Integer, sa.ForeignKey("submissions.id"), nullable=False),
        sa.Column("slot", sa.String(100), nullable=False),
        sa.Column("variant", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("speedup", sa.Float),
        sa.Column("speedup_lo", sa.Float),
        sa.Column("speedup_hi", sa.Float),
        sa.Column("timed", sa.Integer, nullable=False),
        sa.Column("device", sa.Text),
        sa.UniqueConstraint("submission_id", "slot", "variant", name="uq_variants_row"),
    )
    op.create_index("ix_variants_submission_id", "variants", ["submission_id"])


def downgrade() -> None:
    for table in ("variants", "verdicts", "attempts", "submissions", "blobs"):
        op.drop_table(table)
