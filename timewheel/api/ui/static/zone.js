// The zone times are shown in: UTC (the API's own) or the browser's, chosen with the header's
// toggle and kept in local storage. Every time the dashboard shows carries its zone, so that
// a schedule's "01:30:00" next to "(Europe/Berlin)" cannot be read as Berlin time.

const KEY = "timewheel.zone";

export function zoneMode() {
  try {
    return window.localStorage.getItem(KEY) === "local" ? "local" : "utc";
  } catch {
    return "utc"; // storage refused (privacy settings): UTC, the API's zone
  }
}

export function setZoneMode(mode) {
  try {
    if (mode === "local") window.localStorage.setItem(KEY, "local");
    else window.localStorage.removeItem(KEY);
  } catch {
    // nothing to keep it in: the choice lasts until the page is reloaded
  }
}

// The browser's IANA zone, "Europe/Berlin" (or "local" if it does not say).
export function browserZone() {
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
}

// The label shown after a time: "UTC", or the browser's short name for its zone at that date
// ("CET", "GMT+1": it changes with daylight saving time).
export function zoneLabel(date) {
  if (zoneMode() === "utc") return "UTC";
  const part = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" })
    .formatToParts(date).find((p) => p.type === "timeZoneName");
  return part ? part.value : browserZone();
}

// {year, month, day, hours, minutes, seconds} of `date` in the chosen zone.
export function fields(date) {
  const utc = zoneMode() === "utc";
  return {
    year: utc ? date.getUTCFullYear() : date.getFullYear(),
    month: (utc ? date.getUTCMonth() : date.getMonth()) + 1,
    day: utc ? date.getUTCDate() : date.getDate(),
    hours: utc ? date.getUTCHours() : date.getHours(),
    minutes: utc ? date.getUTCMinutes() : date.getMinutes(),
    seconds: utc ? date.getUTCSeconds() : date.getSeconds(),
  };
}
