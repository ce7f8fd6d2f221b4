// serve_page_check.cjs URL CHROMIUM [SHOT.png]: drive the live canvas page in headless Chromium through
// puppeteer-core (scripts/serve_page_check.sh installs it into .node/). Without SHOT: wait until the
// page's stream has ended, print {answer, status, stats, draft_events_seen} as JSON. With SHOT: wait
// until the canvas shows a draft with some settled positions (mid-denoising), take the screenshot, print
// the same fields as they are at that moment.
"use strict";
const puppeteer = require("puppeteer-core");

async function main() {
  const [url, chrome, shot] = process.argv.slice(2);
  const browser = await puppeteer.launch({executablePath: chrome, headless: true,
                                          args: ["--no-sandbox", "--disable-gpu", "--no-first-run"]});
  try {
    const page = await browser.newPage();
    await page.setViewport({width: 1000, height: 760});
    await page.goto(url);
    let drafts = 0;
    if (shot) {
      await page.waitForFunction(() => {
        const s = document.querySelectorAll("#canvas span.settled").length;
        return s >= 8 && s < document.querySelectorAll("#canvas span").length - 8;
      }, {timeout: 300000, polling: 20});
      drafts = 1;
      await page.screenshot({path: shot});
    } else {
      await page.waitForFunction(() => document.querySelectorAll("#canvas span").length > 0, {timeout: 300000, polling: 20});
      drafts = 1;
      await page.waitForFunction(() => /^done \(/.test(document.getElementById("where").textContent),
                                 {timeout: 600000});
    }
    const text = (sel) => page.$eval(sel, (e) => e.textContent);
    console.log(JSON.stringify({answer: await text(".assistant"), status: await text("#where"), stats: await text("#stats"),
                                draft_events_seen: drafts}));
  } finally {
    await browser.close();
  }
}
main().catch((e) => { console.error(String((e && e.stack) || e)); process.exit(1); });
