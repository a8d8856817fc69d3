"""The design space: five dimensions of communication choices, their constraints, and directives."""

from cuco.designspace.constraints import violations
from cuco.designspace.dimensions import DIMENSIONS, Backend, Issuer, Placement, SyncScope
from cuco.designspace.directive import DesignPoint, Directive

__all__ = ["DIMENSIONS", "Backend", "Issuer", "Placement", "SyncScope", "DesignPoint", "Directive", "violations"]
